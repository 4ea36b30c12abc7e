"""--reuse-grad-buf-for-mxfp8-param-ag: MXFP8 parameters all-gathered in bf16 through the gradient buffer and
re-quantised (Megatron-LM d98e8a64 param_and_grad_buffer.py), worked by hand on one stage (issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError
from echo_tune.sim.data_parallel.dp import MXFP8_REQUANT_BYTES_PER_PARAM, stage_tail

B200 = et.load_cluster("b200")
MXFP8 = et.ParallelConfig(global_batch_size=64, use_distributed_optimizer=True, fp8_format="e4m3",
                          fp8_recipe="mxfp8", fp8_param_gather=True)


def test_the_flag_is_read_and_needs_mxfp8_parameters():
    _, parallel, _, _ = parse_megatron_line("--fp8-format e4m3 --fp8-recipe mxfp8 --fp8-param-gather "
                                            "--reuse-grad-buf-for-mxfp8-param-ag")
    assert parallel["reuse_grad_buf_for_mxfp8_param_ag"] is True
    model = et.load_model("llama3-8b")
    for bad in (MXFP8.replace(fp8_recipe="tensorwise", reuse_grad_buf_for_mxfp8_param_ag=True),
                MXFP8.replace(fp8_param_gather=False, reuse_grad_buf_for_mxfp8_param_ag=True)):
        with pytest.raises(ConfigError, match="reuse_grad_buf_for_mxfp8_param_ag` needs"):
            et.simulate(model, B200, 8, bad)


def test_bf16_gather_and_requantisation_by_hand():
    """One stage of 1e9 parameters over DP 8, no overlap: the gather moves 2 B per parameter instead of 1, and
    6.0625 B per parameter (read bf16, write e4m3 row- and column-wise with E8M0 scales, zero the buffer) pass
    through HBM after it."""
    profile = profile_for(B200)
    dp = GroupPlacement(size=8, ranks_per_node=8, num_nodes=1)
    params = 1_000_000_000
    kw = dict(dp=dp, profile=profile, chunk_params=[params], chunk_backward=[(0.0, 1.0)], compute_end_s=1.0)
    plain = stage_tail(parallel=MXFP8, **kw)
    reused = stage_tail(parallel=MXFP8.replace(reuse_grad_buf_for_mxfp8_param_ag=True), **kw)
    gather = {b: collective_time_s("all_gather", params * b, dp, profile) for b in (1.0, 2.0)}
    requant_s = params * 6.0625 / (profile.memory_bandwidth_gbyte_s * 1e9)
    assert MXFP8_REQUANT_BYTES_PER_PARAM == pytest.approx(6.0625)
    assert reused.optimizer_s - plain.optimizer_s == pytest.approx(gather[2.0] - gather[1.0] + requant_s)
    assert reused.dp_exposed_s == plain.dp_exposed_s
