"""The flags written for a layout leave Megatron's defaults out, new fields included: a plain BF16 dense layout writes
no FP4 recipe, no CPU offloading count, no router loss coefficient."""

import dataclasses

import echo_tune as et
from echo_tune.config.launch.megatron_args import to_megatron_flags


def test_defaults_of_new_fields_are_not_written():
    model, parallel = et.load_model("llama3.1-70b"), et.ParallelConfig(global_batch_size=512)
    flags = to_megatron_flags(dataclasses.asdict(model), dataclasses.asdict(parallel), "bf16")
    for flag in ("--fp4-recipe", "--fp4-format", "--cpu-offloading-num-layers", "--moe-aux-loss-coeff",
                 "--moe-router-score-function", "--suggested-communication-unit-size",
                 "--moe-flex-dispatcher-num-sms", "--reuse-grad-buf-for-mxfp8-param-ag"):
        assert flag not in flags, flag
    nvfp4 = to_megatron_flags(dataclasses.asdict(model), dataclasses.asdict(parallel.replace(fp4_format="e2m1")),
                              "bf16")
    assert nvfp4[nvfp4.index("--fp4-format") + 1] == "e2m1" and nvfp4[nvfp4.index("--fp4-recipe") + 1] == "nvfp4"
