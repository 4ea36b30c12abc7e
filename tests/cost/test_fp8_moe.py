"""FP8 in MoE layers (cost/kernels/fp8.py, workload/mlp/moe.py sub-regions): routed and shared expert GEMMs run in FP8
with their casts, the router does not; FP8 weight copies and saved-input savings come from the MoE trace."""

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.cost.kernels.fp8 import FP8_REGIONS, fp8_collective_bytes, fp8_linear_param_count, is_fp8_gemm, where
from echo_tune.sim.schedule.passes import trace_pieces

H100 = et.load_cluster("h100-sxm")
# a small Mixtral-like model with a shared expert, so every part of the MoE block is traced
MOE = et.ModelSpec(name="moe-mixtral-like", num_layers=4, hidden_size=4096, num_attention_heads=32,
                   num_query_groups=8, ffn_hidden_size=14336, seq_length=4096, vocab_size=32000, swiglu=True,
                   normalization="RMSNorm", position_embedding_type="rope", add_bias_linear=False, num_experts=8,
                   moe_router_topk=2, moe_ffn_hidden_size=14336, moe_shared_expert_intermediate_size=4096,
                   moe_token_dispatcher_type="alltoall")
BF16 = et.ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=2,
                         expert_tensor_parallel_size=1, micro_batch_size=1, global_batch_size=16,
                         use_distributed_optimizer=True)
FP8 = BF16.replace(fp8_format="hybrid")


def moe_trace(parallel=BF16):
    layout = check_compatible(MOE, H100, 8, parallel)
    return trace_pieces(MOE, parallel, layout)["moe_layer"]


def test_expert_and_shared_gemms_are_fp8_and_the_router_is_not():
    t = moe_trace()
    moe_gemms = [op for op in t.forward + t.backward if op.kind == "gemm" and op.region == "moe"]
    parts = {op.subregion for op in moe_gemms}
    assert parts == {"router", "experts", "shared"}  # every MoE GEMM is tagged, forward and backward
    for op in moe_gemms:
        assert is_fp8_gemm(op) == (op.subregion != "router")
    # both phases carry the tags: 8 experts / EP 2 = 4 local experts x (fc1, fc2) forward, each with a dgrad
    # and a wgrad GEMM backward (SequentialMLP: one GEMM per expert)
    experts = [op for op in moe_gemms if op.subregion == "experts"]
    assert sum(op.phase == "fwd" for op in experts) == 8 and sum(op.phase == "bwd" for op in experts) == 16


def test_dispatch_collectives_stay_bf16_and_the_shared_experts_sp_gather_is_fp8():
    t = moe_trace()
    colls = [op for op in t.forward + t.backward if op.kind == "collective" and op.region == "moe"]
    a2a = [op for op in colls if op.collective == "all_to_all"]
    assert a2a and {op.subregion for op in a2a} <= {"dispatch", "combine"}
    assert all(fp8_collective_bytes(op) == op.size_bytes for op in a2a)  # token dispatcher: bf16
    shared_gather = [op for op in colls if op.subregion == "shared" and op.collective == "all_gather"]
    assert shared_gather and all(fp8_collective_bytes(op) == op.size_bytes / 2 for op in shared_gather)


def test_fp8_weight_copies_count_the_moe_layers_experts_not_the_dense_layer():
    t = moe_trace()
    counts = t.linear_param_counts
    experts = counts["moe/experts"]
    assert experts == t.expert_param_count  # the local experts' fc1 + fc2
    assert fp8_linear_param_count(t) == sum(n for k, n in counts.items() if k in FP8_REGIONS)
    assert "moe/router" in counts and "moe/router" not in FP8_REGIONS
    layout = check_compatible(MOE, H100, 8, BF16)
    dense = trace_pieces(MOE, BF16, layout)["layer"]
    assert fp8_linear_param_count(t) != fp8_linear_param_count(dense)
    bf16, fp8 = (et.simulate(MOE, H100, 8, p) for p in (BF16, FP8))
    extra = fp8.stage_memory[0].weights_bytes - bf16.stage_memory[0].weights_bytes
    per_stage_layers = MOE.num_layers  # PP 1: every layer is a MoE layer (moe_layer_freq 1)
    assert extra == 2 * fp8_linear_param_count(t) * per_stage_layers  # row- and column-wise FP8 copies


def test_fp8_moe_saves_activations_and_runs_faster():
    bf16, fp8 = (et.simulate(MOE, H100, 8, p) for p in (BF16, FP8))
    assert fp8.stage_memory[0].activations_bytes < bf16.stage_memory[0].activations_bytes
    assert fp8.breakdown_s["compute"] < bf16.breakdown_s["compute"]


def test_where_names_region_and_subregion():
    t = moe_trace()
    assert {where(op) for op in t.forward if op.kind == "gemm"} >= {"qkv", "moe/router", "moe/experts"}


def test_mla_projections_are_fp8_linears_with_their_weight_copies():
    lite = et.load_model("deepseek-v2-lite")
    parallel = et.ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=4,
                                 micro_batch_size=1, global_batch_size=16, use_distributed_optimizer=True)
    layout = check_compatible(lite, H100, 8, parallel)
    layer = trace_pieces(lite, parallel, layout)["layer"]
    up = [op for op in layer.forward + layer.backward if op.kind == "gemm" and op.region == "mla_up_proj"]
    assert up and all(is_fp8_gemm(op) for op in up)
    counts = layer.linear_param_counts
    assert counts["mla_up_proj"] > 0 and counts["qkv"] > 0  # down projection (qkv) and up projections
    norms = sum(t for k, t in counts.items() if "norm" in k)
    assert norms == 0 and fp8_linear_param_count(layer) == sum(counts.values())


def test_fp8_savings_leave_out_what_selective_recompute_already_drops():
    from echo_tune.cost.kernels.fp8 import fp8_activation_savings_bytes

    t = moe_trace()
    full = fp8_activation_savings_bytes(t, 2, True)
    without_moe = fp8_activation_savings_bytes(t, 2, True, ("moe",))
    expert_inputs = sum(op.gemm_mnk[0] * op.gemm_mnk[2] for op in t.forward
                        if is_fp8_gemm(op) and op.subregion == "experts")
    assert 0 < without_moe < full and full - without_moe >= expert_inputs
    # under SP the QKV GEMM follows its TP all-gather: it saves the local shard, 1/TP of its input
    qkv = next(op for op in t.forward if is_fp8_gemm(op) and op.region == "qkv")
    only_qkv = fp8_activation_savings_bytes(t, 2, True, ("attention_proj", "mlp", "moe"))
    assert only_qkv == qkv.gemm_mnk[0] * qkv.gemm_mnk[2] / 2


def test_amax_reduction_counts_the_moe_layers_fp8_tensors():
    from echo_tune.cost.kernels.fp8 import AMAX_TENSORS_PER_LAYER, amax_tensors_per_layer

    layout = check_compatible(MOE, H100, 8, FP8)
    pieces = trace_pieces(MOE, FP8, layout)
    dense_only = {"layer": pieces["layer"]}
    assert amax_tensors_per_layer(dense_only) == AMAX_TENSORS_PER_LAYER  # qkv, proj, fc1, fc2
    # attention (2) + 4 local experts x 2 + shared expert (2) linears, 3 tensors each
    assert amax_tensors_per_layer(pieces) == 3 * (2 + 8 + 2)
