"""MoE in the simulator: traced dispatch, all-to-all placement, expert memory, imbalance, expert-DP tail."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import GroupPlacement, check_compatible
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import profile_for
from echo_tune.sim.memory.stage import bytes_per_param
from echo_tune.workload import trace_moe_layer

H100 = et.load_cluster("h100-sxm")
PROFILE = profile_for(H100)
MIXTRAL = et.load_model("mixtral-8x7b")
SMALL = MIXTRAL.replace(num_layers=4, seq_length=1024)


def sim(model=SMALL, num_gpus=16, **kw):
    kw.setdefault("global_batch_size", 64)
    return et.simulate(model, H100, num_gpus, et.ParallelConfig(**kw))


def collectives(trace, group):
    return [op for op in trace.forward + trace.backward if op.kind == "collective" and op.group == group]


def test_alltoall_dispatch_is_traced_with_megatron_sizes():
    # tokens per rank T = s / TP (sequence parallel) x b = 512; top-2 copies of h = 4096 in bf16
    t = trace_moe_layer(SMALL, tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=4,
                        expert_tensor_parallel_size=1)
    a2a = collectives(t, "ep")
    # dispatch (tokens and their probabilities: token_dispatcher.py ``global_probs = all_to_all(...)``,
    # Megatron-LM d98e8a64ddf3) + combine, forward and backward
    assert [op.collective for op in a2a] == ["all_to_all"] * 6
    assert {op.size_bytes for op in a2a} == {512 * 2 * 4096 * 2, 512 * 2 * 1 * 2}  # [T k, h] and [T k, 1] bf16
    # 8 experts / EP 4 = 2 local experts, grouped GEMM: one batched GEMM per expert projection and pass
    fwd_gemms = [op for op in t.forward if op.kind == "gemm" and op.region == "moe"]
    assert len(fwd_gemms) == 3  # router, fc1, fc2
    # routed-expert FLOPs per rank = tokens x top-k x 2 x 3 h ffn (SwiGLU), whatever EP is
    expert_flops = sum(op.flops for op in fwd_gemms if op.gemm_mnk[1] != 8)
    assert expert_flops == pytest.approx(512 * 2 * 2 * 3 * 4096 * 14336, rel=1e-9)


def test_tokens_are_regrouped_by_local_expert_and_back_both_ways():
    # token_dispatcher.py (Megatron-LM d98e8a64ddf3): dispatch_postprocess sorts the received tokens by local expert
    # and combine_preprocess restores their order (sort_chunks_by_idxs), each a [T k, h] copy forward and one of
    # its gradient backward; with one local expert there is nothing to regroup.
    rows_bytes = 512 * 2 * 4096 * 2  # T k rows of h in bf16, read and written

    def copies(ep):
        t = trace_moe_layer(SMALL, tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=ep,
                            expert_tensor_parallel_size=1)
        return [[op for op in ops if op.name == "aten.clone" and op.region == "moe" and op.bytes == 2 * rows_bytes]
                for ops in (t.forward, t.backward)]

    fwd, bwd = copies(4)  # 2 local experts
    assert [op.subregion for op in fwd] == ["dispatch", "combine"]
    assert sorted(op.subregion for op in bwd) == ["combine", "dispatch"]
    assert copies(8) == [[], []]  # 1 local expert


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_flex_dispatch_permutes_inside_its_kernels(backend):
    # MoEFlexTokenDispatcher (Megatron-LM d98e8a64ddf3): one dispatch and one combine call each way, the tokens'
    # probabilities sent with them, the top-k copies made and summed inside the kernels. DeepEP's received tokens are
    # then regrouped by local expert and back (permute / unpermute: a copy each way, forward and backward);
    # HybridEP's dispatch_with_permute does it where its plain dispatch copies out of its buffer.
    rows_bytes = 512 * 2 * 4096 * 2
    t = trace_moe_layer(SMALL.replace(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=backend),
                        tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=4,
                        expert_tensor_parallel_size=1)
    a2a = [op for op in collectives(t, "ep") if op.collective == "all_to_all"]
    assert len(a2a) == 4 and {op.size_bytes for op in a2a} == {rows_bytes}
    # HybridEP's metadata step all-gathers the [tokens, experts] routing map inside its dispatch call
    # (workload/mlp/flex_metadata.py): 512 tokens per rank, bools of 8 experts (SMALL), from 4 ranks
    gathers = [op.size_bytes for op in collectives(t, "ep") if op.collective == "all_gather"]
    assert gathers == ([512 * SMALL.num_experts * 4] if backend == "hybridep" else [])
    routed = [op for op in t.forward + t.backward if op.region == "moe" and op.subregion in ("dispatch", "combine")
              and op.kind == "memory" and op.bytes >= rows_bytes]  # the probabilities' own copies are [T k, 1]
    if backend == "hybridep":
        assert routed == []
    else:
        assert [(op.phase, op.subregion, op.bytes) for op in routed] == [
            ("fwd", "dispatch", 2 * rows_bytes), ("fwd", "combine", 2 * rows_bytes),
            ("bwd", "combine", 2 * rows_bytes), ("bwd", "dispatch", 2 * rows_bytes)]


def test_sequential_experts_run_one_gemm_each_and_allgather_dispatcher_gathers():
    loop = SMALL.replace(moe_grouped_gemm=False)
    t = trace_moe_layer(loop, tensor_model_parallel_size=1, expert_model_parallel_size=2)
    assert len([op for op in t.forward if op.kind == "gemm" and op.region == "moe"]) == 1 + 2 * 4
    ag = trace_moe_layer(SMALL.replace(moe_token_dispatcher_type="allgather"), tensor_model_parallel_size=2,
                         sequence_parallel=True, expert_model_parallel_size=4, expert_tensor_parallel_size=1)
    assert {op.collective for op in collectives(ag, "tpep")} == {"all_gather", "reduce_scatter"}
    assert not collectives(ag, "ep")


def test_fp8_experts_pad_their_tokens():
    # TEGroupedMLP (Megatron-LM d98e8a64ddf3 experts.py) under FP8: Fp8Padding of the tokens and their probabilities
    # before fc1, Fp8Unpadding of the output after fc2, each a copy forward and one of the gradient backward (TE
    # fp8_padding.py); HybridEP's dispatch pads the tokens itself, and drop-and-pad leaves them aligned
    t = trace_moe_layer(SMALL, tensor_model_parallel_size=1, expert_model_parallel_size=2)
    rows_bytes = 1024 * 2 * 4096 * 2
    pads = [op for op in t.forward + t.backward if op.subregion == "expert_pad"]
    assert sorted(op.bytes for op in pads if op.bytes >= rows_bytes) == [2 * rows_bytes] * 4
    assert len(pads) == 6  # and the probabilities', forward and backward

    from echo_tune.cost.collectives.moe_dispatch import moe_kernels
    from echo_tune.sim.schedule.costing import CostContext, phase_cost_and_host_s
    layout = check_compatible(SMALL, H100, 16, et.ParallelConfig(global_batch_size=64, expert_model_parallel_size=2))

    def cost(fp8_recipe, model=SMALL, syncs=True):
        ctx = CostContext(profile=PROFILE, gpu=H100.gpu, precision="bf16", groups=layout.groups, fp8_recipe=fp8_recipe,
                          moe=moe_kernels(model, H100), moe_dispatch_syncs=syncs)
        part, host_s = phase_cost_and_host_s(tuple(pads), ctx)
        return part.total_s, host_s

    assert cost(None) == (0.0, 0.0)  # BF16: no padding
    time_s, host_s = cost("tensorwise")
    assert time_s > 4 * 2 * rows_bytes / (PROFILE.memory_bandwidth_gbyte_s * 1e9)  # four [T k, h] copies read and written
    assert host_s == pytest.approx(6 * PROFILE.host_time_per_kernel_s)  # six Python module calls
    hybridep = SMALL.replace(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")
    assert cost("tensorwise", hybridep) == (0.0, 0.0) == cost("tensorwise", syncs=False)  # HybridEP; drop-and-pad


def test_sequential_experts_move_no_more_memory_than_grouped_ones_but_the_token_split():
    # SequentialMLP (Megatron-LM d98e8a64ddf3 experts.py): torch.split of the tokens (backward: one cat), each
    # expert's own parameters (their gradients written by the weight-gradient GEMMs), torch.cat of the outputs.
    # Slicing one stacked weight per expert used to charge a zero-filled stacked gradient per expert and their
    # sums: 4 local experts of SMALL's 3 x 4096 x 14336 weights added ~20 GB of backward traffic per layer.
    def memory_bytes(model):
        t = trace_moe_layer(model, tensor_model_parallel_size=1, expert_model_parallel_size=2)
        return sum(op.bytes for op in t.forward + t.backward if op.kind == "memory" and op.region == "moe"
                   and op.subregion != "expert_pad")  # timed only under FP8 (test_fp8_experts_pad_their_tokens)

    tokens = 1024 * 2 * 4096 * 2  # [s b k, h] bf16 copies reaching the experts (balanced)
    extra = memory_bytes(SMALL.replace(moe_grouped_gemm=False)) - memory_bytes(SMALL)
    assert 0 <= extra <= 6 * tokens  # cat of the outputs forward, of the token gradients backward
    no_select = trace_moe_layer(SMALL.replace(moe_grouped_gemm=False), tensor_model_parallel_size=1,
                                expert_model_parallel_size=2)
    assert not [op for op in no_select.backward if op.name in ("aten.select_backward", "aten.slice_backward")]


def test_all_to_all_across_nodes_goes_through_each_ranks_nic():
    size = 256 << 20
    inside = collective_time_s("all_to_all", size, GroupPlacement(size=8, ranks_per_node=8, num_nodes=1), PROFILE)
    across = collective_time_s("all_to_all", size, GroupPlacement(size=8, ranks_per_node=2, num_nodes=4), PROFILE)
    inter = PROFILE.link("inter_node", "all_to_all")
    # 6 of 8 shares leave the node through this rank's own NIC share
    assert across == pytest.approx(6 / 8 * size / (inter.bus_bandwidth_gbyte_s * 1e9), rel=0.02)
    assert across > 3 * inside


def test_ep_inside_a_node_is_faster_than_across_nodes():
    # same model and ranks; only the expert placement differs: ETP 1 keeps the 8 EP ranks on one node,
    # ETP = TP = 4 spreads them over 4 nodes
    common = dict(model=MIXTRAL.replace(num_layers=8), num_gpus=32, tensor_model_parallel_size=4,
                  sequence_parallel=True, expert_model_parallel_size=8)
    near = sim(expert_tensor_parallel_size=1, **common)
    far = sim(**common)
    assert far.breakdown_s["ep_comm"] > near.breakdown_s["ep_comm"] > 0


def test_expert_memory_is_sharded_over_ep_and_optimizer_over_expert_dp():
    lay_kw = dict(pipeline_model_parallel_size=1, use_distributed_optimizer=True)
    one, eight = sim(expert_model_parallel_size=1, **lay_kw), sim(expert_model_parallel_size=8, **lay_kw)
    moe = trace_moe_layer(SMALL, tensor_model_parallel_size=1, expert_model_parallel_size=8)
    dense_params = moe.param_count - moe.expert_param_count
    assert moe.expert_param_count == 3 * 4096 * 14336  # one local expert of 8
    # weights: bf16 of every layer's attention, router and one expert, plus embedding and output
    w8, w1 = eight.stage_memory[0].weights_bytes, one.stage_memory[0].weights_bytes
    assert w1 - w8 == pytest.approx(2 * 4 * 7 * 3 * 4096 * 14336, rel=1e-9)
    # optimizer states: 12 bytes/param over DP = 16 for dense params, over EDP = 16 / 8 = 2 for experts
    layout8 = check_compatible(SMALL, H100, 16, et.ParallelConfig(global_batch_size=64, expert_model_parallel_size=8,
                                                                  **lay_kw))
    assert layout8.expert_data_parallel_size == 2
    output_params = eight.stage_memory[0].weights_bytes / 2 - 4 * moe.param_count
    expected = 12 / 16 * (4 * dense_params + output_params) + 12 / 2 * 4 * moe.expert_param_count
    assert eight.stage_memory[0].optimizer_bytes == pytest.approx(expected, rel=1e-6)
    assert bytes_per_param(et.ParallelConfig(global_batch_size=1, use_distributed_optimizer=True), 2)[2] == 6


def test_imbalance_slows_the_step_and_capacity_caps_it():
    base = sim(expert_model_parallel_size=8)
    skewed = sim(SMALL.replace(moe_routing_imbalance=2.0), expert_model_parallel_size=8)
    capped = sim(SMALL.replace(moe_routing_imbalance=2.0, moe_expert_capacity_factor=1.25),
                 expert_model_parallel_size=8)
    assert base.step_time_s < capped.step_time_s < skewed.step_time_s
    assert skewed.model_flops_per_step == base.model_flops_per_step  # Megatron counts balanced FLOPs


@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_moe_costs_more_than_its_dense_shape_and_mixed_stages_count_their_layers():
    # top-2 of experts the size of the dense MLP: twice its GEMMs (attention is ~1/5 of a layer here)
    dense = sim(SMALL.replace(num_experts=None))
    moe = sim(expert_model_parallel_size=8)
    assert moe.breakdown_s["compute"] > 1.5 * dense.breakdown_s["compute"]
    half = sim(SMALL.replace(moe_layer_freq="[0,0,1,1]"), pipeline_model_parallel_size=2,
               expert_model_parallel_size=8)
    assert dense.step_time_s < half.step_time_s < moe.step_time_s
    held = sim(SMALL.replace(moe_layer_freq="[0,0,1,1]"), pipeline_model_parallel_size=2,
               expert_model_parallel_size=2)  # 4 local experts per MoE layer on stage 1, dense MLPs on stage 0
    assert held.stage_memory[1].weights_bytes > 2 * held.stage_memory[0].weights_bytes


def test_expert_gradients_reduce_over_expert_dp():
    from echo_tune.sim.data_parallel.dp import stage_tail

    par = et.ParallelConfig(global_batch_size=64, use_distributed_optimizer=True)
    dp = GroupPlacement(size=16, ranks_per_node=8, num_nodes=2)
    edp_near, edp_far = (GroupPlacement(size=2, ranks_per_node=2, num_nodes=1),
                         GroupPlacement(size=2, ranks_per_node=1, num_nodes=2))
    kw = dict(parallel=par, dp=dp, profile=PROFILE, chunk_params=[2_000_000_000], chunk_backward=[(0.0, 1.0)],
              compute_end_s=1.0, expert_chunk_params=[1_800_000_000])
    near, far = stage_tail(edp=edp_near, **kw), stage_tail(edp=edp_far, **kw)
    assert far.dp_exposed_s > near.dp_exposed_s > 0
    dense_only = stage_tail(parallel=par, dp=dp, profile=PROFILE, chunk_params=[200_000_000],
                            chunk_backward=[(0.0, 1.0)], compute_end_s=1.0)
    assert near.dp_exposed_s > dense_only.dp_exposed_s


def test_recompute_modules_trade_time_for_activation_memory():
    # DeepSeek-V2-Lite: MLA + MoE; Megatron-Core's modules, output-discarding for layernorm / mla_up_proj
    m = et.load_model("deepseek-v2-lite")

    def run(modules):
        return et.simulate(m, H100, 16, et.ParallelConfig(
            global_batch_size=64, tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=8,
            recompute_granularity="selective", recompute_modules=modules))

    core, norm, moe = run(None), run(["core_attn", "layernorm"]), run(["core_attn", "layernorm", "moe"])
    mem = [r.stage_memory[0].activations_bytes for r in (core, norm, moe)]
    rec = [r.breakdown_s["recompute"] for r in (core, norm, moe)]
    assert mem[0] > mem[1] > mem[2] and rec[0] < rec[1] < rec[2]
    with pytest.raises(et.ConfigError, match="gdn_norm_out"):  # Megatron's GatedDeltaNet module: not modelled
        et.ParallelConfig(global_batch_size=1, recompute_modules=["gdn_norm_out"])


def test_probs_on_input_weight_the_copies_before_the_dispatch():
    top1 = SMALL.replace(moe_router_topk=1, moe_apply_probs_on_input=True)
    t = trace_moe_layer(top1, tensor_model_parallel_size=1, expert_model_parallel_size=4, expert_tensor_parallel_size=1)
    muls = [op.subregion for op in t.forward if op.region == "moe" and op.name == "aten.mul"]
    assert muls == ["dispatch"]  # one weighting, before the experts; none at the un-permute
    plain = trace_moe_layer(SMALL.replace(moe_router_topk=1), tensor_model_parallel_size=1,
                            expert_model_parallel_size=4, expert_tensor_parallel_size=1)
    # without it the probabilities weight the fused SwiGLU's output inside its own kernel (experts.py
    # ``weighted_bias_swiglu_impl``, Megatron-LM d98e8a64ddf3): no separate multiply at all
    assert [op.subregion for op in plain.forward if op.region == "moe" and op.name == "aten.mul"] == []
