"""--use-transformer-engine-op-fuser (Megatron-LM d98e8a64 moe/experts.py fused grouped MLP, TE ops.GroupedLinear):
each grouped expert GEMM is one kernel over all local experts, costed at the folded shape (issue 39)."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.cost.kernels.moe_grouped_gemm import is_grouped_expert_gemm, per_expert_op
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.costing import phase_cost
from echo_tune.sim.schedule.passes import trace_pieces
from echo_tune.sim.step_setup import cost_context

QWEN = et.load_model("qwen3-30b-a3b")  # 128 experts of 768, top-8
B200 = et.load_cluster("b200")
LAYOUT = et.ParallelConfig(expert_model_parallel_size=8, micro_batch_size=1, global_batch_size=64,
                           use_distributed_optimizer=True)


def test_flag_and_megatrons_rules():
    model, _, _, _ = parse_megatron_line("--use-transformer-engine-op-fuser")
    assert model["use_transformer_engine_op_fuser"] is True
    fused = QWEN.replace(use_transformer_engine_op_fuser=True)
    with pytest.raises(ConfigError, match="expert_tensor_parallel_size 1"):
        check_compatible(fused, B200, 8, LAYOUT.replace(tensor_model_parallel_size=2, sequence_parallel=True,
                                                        expert_tensor_parallel_size=2, expert_model_parallel_size=4))


def _expert_gemms_s(model) -> tuple[float, list]:
    layout = check_compatible(model, B200, 8, LAYOUT)
    profile = profile_for(B200)
    ctx = dataclasses.replace(cost_context(model, B200, LAYOUT, layout, profile), host_bound=False)
    layer = trace_pieces(model, LAYOUT, layout)["moe_layer"]
    gemms = tuple(op for op in layer.forward + layer.backward if is_grouped_expert_gemm(op))
    return phase_cost(gemms, ctx).compute_s, list(gemms)


def test_one_kernel_per_grouped_gemm_at_the_folded_shape_by_hand():
    profile, gpu = profile_for(B200), B200.gpu
    fused_s, gemms = _expert_gemms_s(QWEN.replace(use_transformer_engine_op_fuser=True))
    plain_s, _ = _expert_gemms_s(QWEN)
    assert len(gemms) == 6 and all(op.gemm_groups == 16 for op in gemms)  # fc1, fc2: fwd, dgrad, wgrad; 16 local
    folded = sum(op_time_s(op, profile, gpu, "bf16") for op in gemms)  # one launch each, all rows together
    per_expert = sum(16 * op_time_s(per_expert_op(op), profile, gpu, "bf16") for op in gemms)
    assert fused_s == pytest.approx(folded) and plain_s == pytest.approx(per_expert)
    assert fused_s < plain_s  # fewer launches, fuller tiles


def test_the_host_issues_far_fewer_kernels():
    """Qwen3-30B-A3B on 8 B200 at MBS 1: per-expert kernels bind the host; the grouped kernels do not."""
    plain = et.simulate(QWEN, B200, 8, LAYOUT)
    fused = et.simulate(QWEN.replace(use_transformer_engine_op_fuser=True), B200, 8, LAYOUT)
    assert fused.step_time_s < 0.8 * plain.step_time_s
