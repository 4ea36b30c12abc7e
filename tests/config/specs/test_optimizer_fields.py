"""--optimizer and the Muon flags: read from a launch line and written back (config/specs/optimizer_fields.py)."""

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags

LINE = ("--optimizer muon --muon-num-ns-steps 10 --muon-tp-mode blockwise --muon-no-split-qkv "
        "--muon-scalar-optimizer lion --no-use-layer-wise-param-layout --muon-momentum 0.9 --muon-scale-mode spectral")


def test_muon_flags_parse_and_write_back():
    _, fields, _, ignored = parse_megatron_line(LINE)
    assert fields == {"optimizer": "muon", "muon_num_ns_steps": 10, "muon_tp_mode": "blockwise",
                      "muon_split_qkv": False, "muon_scalar_optimizer": "lion", "use_layer_wise_param_layout": False}
    assert ignored == ["--muon-momentum", "--muon-scale-mode"]  # hyper-parameters: the same kernels
    parallel = et.ParallelConfig(global_batch_size=8, **fields)
    again = parse_megatron_line(" ".join(to_megatron_flags({}, parallel.to_dict(), "bf16")))[1]
    assert {k: again[k] for k in fields} == fields


def test_adam_and_muon_defaults_are_not_written():
    flags = to_megatron_flags({}, et.ParallelConfig(global_batch_size=8).to_dict(), "bf16")
    assert not [f for f in flags if "optimizer" in f or "muon" in f or "layer-wise" in f]


def test_dist_muon_is_muon_with_the_distributed_optimizer():
    _, fields, _, _ = parse_megatron_line("--optimizer dist_muon")
    parallel = et.ParallelConfig(global_batch_size=8, **fields)
    assert (parallel.optimizer, parallel.use_distributed_optimizer) == ("muon", True)
    flags = to_megatron_flags({}, parallel.to_dict(), "bf16")
    assert "--use-distributed-optimizer" in flags and flags[flags.index("--optimizer") + 1] == "muon"
