"""--recompute-modules moe_act / shared_experts: the MoE sub-regions selective recompute replays."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.cost.profile import profile_for
from echo_tune.sim.memory.stage import layer_activation_bytes
from echo_tune.workload import trace_moe_layer

H100 = et.load_cluster("h100-sxm")
PROFILE = profile_for(H100)
# Mixtral's MoE layer (h 4096, 8 experts top-2, expert ffn 14336, fused SwiGLU), shortened
SMALL = et.load_model("mixtral-8x7b").replace(num_layers=4, seq_length=1024)
ROWS = 1024 * 2  # s x b = 1024 tokens per rank (TP 1), 2 routed copies each, balanced over EP (imbalance 1)
ACT_OUT_BYTES = ROWS * 14336 * 2  # the activation's output [rows, ffn] in bf16, saved by fc2


def _parallel(modules, **kw):
    return et.ParallelConfig(global_batch_size=8, expert_model_parallel_size=4, recompute_granularity="selective",
                             recompute_modules=modules, **kw)


def test_moe_act_frees_the_activation_output():
    trace = trace_moe_layer(SMALL, tensor_model_parallel_size=1, expert_model_parallel_size=4,
                            expert_tensor_parallel_size=1)
    assert trace.region_created_bytes["moe/expert_act"] == ACT_OUT_BYTES
    # moe_act checkpoints without output (CheckpointWithoutOutput, experts.py): fc2's saved input goes; the
    # activation's input (fc1's output) stays as the checkpoint's input
    base = check_compatible(SMALL, H100, 4, _parallel(["core_attn"]))
    act = check_compatible(SMALL, H100, 4, _parallel(["core_attn", "moe_act"]))
    kept_base, _ = layer_activation_bytes(trace, base, 1)
    kept_act, _ = layer_activation_bytes(trace, act, 1)
    assert kept_base - kept_act == ACT_OUT_BYTES


@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_moe_act_replays_only_the_activation_kernel():
    # 4 MoE layers x 2 micro-batches (GBS 8 / (mbs 1 x DP 4)) replay one fused SwiGLU each: it reads fc1's
    # output [rows, 2 ffn] and writes [rows, ffn], bf16: 3 x ACT_OUT_BYTES at the HBM bandwidth, plus a launch
    kernel_s = 3 * ACT_OUT_BYTES / (PROFILE.memory_bandwidth_gbyte_s * 1e9) + PROFILE.kernel_launch_overhead_s
    base = et.simulate(SMALL, H100, 4, _parallel(["core_attn"]))
    act = et.simulate(SMALL, H100, 4, _parallel(["core_attn", "moe_act"]))
    extra = act.breakdown_s["recompute"] - base.breakdown_s["recompute"]
    assert abs(extra - 4 * 2 * kernel_s) < 1e-9 * max(1.0, extra)
    assert act.stage_memory[0].activations_bytes < base.stage_memory[0].activations_bytes


def test_shared_experts_recompute_keeps_the_output_and_frees_the_inside():
    model = SMALL.replace(moe_shared_expert_intermediate_size=4096)
    trace = trace_moe_layer(model, tensor_model_parallel_size=1, expert_model_parallel_size=4,
                            expert_tensor_parallel_size=1)
    # inside the shared expert (1024 tokens, its ffn 4096, SwiGLU): fc1's output [1024, 2 x 4096] saved by the
    # activation and the activation's output [1024, 4096] saved by fc2; its input and output stay
    assert trace.region_internal_bytes["moe/shared"] == 1024 * (2 * 4096 + 4096) * 2
    base = et.simulate(model, H100, 4, _parallel(["core_attn"]))
    shared = et.simulate(model, H100, 4, _parallel(["core_attn", "shared_experts"]))
    assert shared.breakdown_s["recompute"] > base.breakdown_s["recompute"]
    assert shared.stage_memory[0].activations_bytes < base.stage_memory[0].activations_bytes


def test_moe_act_needs_grouped_gemm():
    with pytest.raises(et.ConfigError, match="moe_grouped_gemm"):
        et.simulate(SMALL.replace(moe_grouped_gemm=False), H100, 4, _parallel(["moe_act"]))


def test_moe_act_under_fp8_saves_no_fp8_copy_of_fc2s_input():
    # FP8 linears save their input in FP8 (1 byte of 2): fc1's input [rows, h] and fc2's [rows, ffn] in the
    # routed experts. Under moe_act fc2 keeps its original bf16 input (set_save_original_input, experts.py),
    # discarded by the recompute: only fc1's saving is left of the two.
    from echo_tune.cost.kernels.fp8 import fp8_activation_savings_bytes

    trace = trace_moe_layer(SMALL, tensor_model_parallel_size=1, expert_model_parallel_size=4,
                            expert_tensor_parallel_size=1)
    plain = fp8_activation_savings_bytes(trace, 1, False, ("core_attention",))
    act = fp8_activation_savings_bytes(trace, 1, False, ("core_attention", "moe/expert_act"))
    assert plain - act == ROWS * 14336  # fc2's input elements, one byte each
    with pytest.raises(et.ConfigError, match="delayed"):
        et.simulate(SMALL, H100, 4, _parallel(["moe_act"], fp8_format="hybrid", fp8_recipe="delayed"))


def test_probabilities_weight_the_experts_not_the_unpermute():
    # Megatron-LM d98e8a64ddf3: TEGroupedMLP applies the permuted probs in bias_act_func (experts.py) and the
    # all-to-all dispatcher's combine_postprocess un-permutes without probs, so TE's fused un-permute keeps
    # only its index map: no [T k, h] copy of the returned tokens is saved. By hand: "combine" saves nothing;
    # "dispatch" saves fc1's input [ROWS, h] bf16 = 2048 x 4096 x 2 and the permuted probs [ROWS, 1] bf16
    # = 2048 x 2, kept by the fused weighted SwiGLU (fused_bias_swiglu.py WeightedSwiGLUFunction).
    trace = trace_moe_layer(SMALL, tensor_model_parallel_size=1, expert_model_parallel_size=4,
                            expert_tensor_parallel_size=1)
    assert trace.region_created_bytes.get("moe/combine", 0) == 0
    assert trace.region_created_bytes["moe/dispatch"] == ROWS * 4096 * 2 + ROWS * 2
