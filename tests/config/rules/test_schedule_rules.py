"""The schedule / step feature flags: parsed from a launch line and written back (config/launch/megatron_args.py)."""

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags

LINE = ("--overlap-param-gather-with-optimizer-step --defer-embedding-wgrad-compute --wgrad-deferral-limit 4 "
        "--num-distributed-optimizer-instances 2 --cuda-graph-impl transformer_engine --cuda-graph-modules attn mlp "
        "--cuda-graph-warmup-steps 2")


def test_flags_parse_and_write_back():
    _, fields, _, ignored = parse_megatron_line(LINE)
    assert fields == {"overlap_param_gather_with_optimizer_step": True, "defer_embedding_wgrad_compute": True,
                      "wgrad_deferral_limit": 4, "num_distributed_optimizer_instances": 2,
                      "cuda_graph_impl": "transformer_engine", "cuda_graph_modules": ("attn", "mlp"),
                      "cuda_graph_warmup_steps": 2}
    assert not ignored
    parallel = et.ParallelConfig(global_batch_size=8, **fields)
    again = parse_megatron_line(" ".join(to_megatron_flags({}, parallel.to_dict(), "bf16")))[1]
    assert {k: again[k] for k in fields} == fields


def test_defaults_are_not_written():
    flags = to_megatron_flags({}, et.ParallelConfig(global_batch_size=8, wgrad_deferral_limit=4).to_dict(), "bf16")
    # the limit belongs to --defer-embedding-wgrad-compute; the others are at Megatron's defaults
    for flag in ("--wgrad-deferral-limit", "--num-distributed-optimizer-instances", "--cuda-graph-impl",
                 "--cuda-graph-warmup-steps", "--defer-embedding-wgrad-compute"):
        assert flag not in flags


def test_overlap_p2p_warmup_flush_is_read_and_written():
    _, fields, _, ignored = parse_megatron_line("--overlap-p2p-communication-warmup-flush")
    assert fields == {"overlap_p2p_comm_warmup_flush": True} and not ignored
    parallel = et.ParallelConfig(global_batch_size=8, **fields)
    assert "--overlap-p2p-communication-warmup-flush" in to_megatron_flags({}, parallel.to_dict(), "bf16")
