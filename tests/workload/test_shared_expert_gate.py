"""--moe-shared-expert-gate (Megatron-LM d98e8a64 moe/shared_experts.py): the shared expert's output times
sigmoid(x @ w), w [1, hidden], traced apart from the TE linears (never FP8), its weight counted (issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.specs.moe_fields import moe_params
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.passes import trace_pieces

DSV2 = et.load_model("deepseek-v2-lite")  # 64 experts, a 2,816-wide shared expert, hidden 2048
H100 = et.load_cluster("h100-sxm")
LAYOUT = et.ParallelConfig(expert_model_parallel_size=8, micro_batch_size=1, global_batch_size=8,
                           use_distributed_optimizer=True)


def test_flag_and_rule():
    model, _, _, _ = parse_megatron_line("--moe-shared-expert-gate")
    assert model["moe_shared_expert_gate"] is True
    with pytest.raises(ConfigError, match="gates the shared expert"):
        DSV2.replace(moe_shared_expert_gate=True, moe_shared_expert_intermediate_size=None)


def test_the_gate_by_hand():
    gated = DSV2.replace(moe_shared_expert_gate=True)
    assert moe_params(gated) - moe_params(DSV2) == 2048  # the [1, hidden] gate weight
    layout = check_compatible(gated, H100, 8, LAYOUT)
    layer = trace_pieces(gated, LAYOUT, layout)["moe_layer"]
    gate = [op for op in layer.forward if op.region == "moe" and op.subregion == "shared_gate"]
    gemm = [op for op in gate if op.kind == "gemm"]
    tokens = DSV2.seq_length  # MBS 1, TP 1
    assert len(gemm) == 1 and gemm[0].flops == pytest.approx(2 * tokens * 2048)  # a GEMV to one logit per token
    assert any(op.kind == "memory" for op in gate)  # the sigmoid and the product
    from echo_tune.cost.kernels.fp8 import is_fp8_gemm

    assert not any(is_fp8_gemm(op) for op in gate)  # a torch linear, not a TE one
    plain = trace_pieces(DSV2, LAYOUT, check_compatible(DSV2, H100, 8, LAYOUT))["moe_layer"]
    assert not any(op.subregion == "shared_gate" for op in plain.forward)
    fp8 = LAYOUT.replace(fp8_format="hybrid")
    slower = et.simulate(gated, H100, 8, fp8).step_time_s
    assert slower > et.simulate(DSV2, H100, 8, fp8).step_time_s  # runs, and costs a little
