"""The flex dispatcher's kernels around DeepEP's and HybridEP's calls (workload/mlp/flex_metadata.py), as Megatron-LM
d98e8a64 runs them: DeepEP's top-k of the probabilities, its layout call, and the received indices turned into a
per-expert map (one fused kernel with --enable-experimental and --moe-permute-fusion, else a chain with three host
waits); HybridEP's all-gather of the routing map, its preprocessing kernels and its token counts."""

from collections import Counter

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.cost.host.host_bound import HOST_READ_OP
from echo_tune.sim.schedule.passes import trace_pieces

QWEN = et.load_model("qwen3-30b-a3b").replace(num_layers=2, moe_router_fusion=True, moe_permute_fusion=True,
                                               moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="deepep",
                                               moe_router_dtype=None)  # a bf16 router, as the Qwen3 recipes run it
H100 = et.load_cluster("h100-sxm")
LAYOUT = et.ParallelConfig(expert_model_parallel_size=8, micro_batch_size=1, global_batch_size=8,
                           use_distributed_optimizer=True)


def _ops(model, subregion, phase="fwd"):
    layer = trace_pieces(model, LAYOUT, check_compatible(model, H100, 8, LAYOUT))["moe_layer"]
    return [op.collective or op.name for op in (layer.forward if phase == "fwd" else layer.backward)
            if op.subregion == subregion]


def test_deepep_without_the_experimental_fusion_runs_the_map_as_a_chain_with_three_host_waits():
    meta = _ops(QWEN, "dispatch_metadata")
    assert meta[:2] == ["aten._to_copy", "echo_tune.deepep_dispatch_layout"]  # the bf16 probabilities to fp32 first
    assert Counter(meta)[HOST_READ_OP] == 3  # indices[mask], repeat_interleave's size, probs[mask]
    assert Counter(meta)["aten.index_put_"] == 2 and meta[-1] == "aten._to_copy" and len(meta) >= 14
    assert _ops(QWEN, "preprocess") == ["aten.topk"]  # setup_metadata, in the moe_preprocess graph's reach
    assert _ops(QWEN, "dispatch_metadata", "bwd") == ["aten._to_copy"]  # their gradient back to bf16
    assert _ops(QWEN.replace(moe_router_dtype="fp32"), "dispatch_metadata", "bwd") == []  # fp32 router: no casts


def test_the_experimental_fusion_makes_the_map_one_kernel():
    fused = QWEN.replace(enable_experimental=True, moe_router_dtype="fp32")
    assert _ops(fused, "dispatch_metadata") == ["echo_tune.deepep_dispatch_layout", "echo_tune.fused_indices_to_multihot"]
    assert _ops(fused.replace(moe_permute_fusion=False), "dispatch_metadata")[-1] == "aten._to_copy"  # needs both
    assert parse_megatron_line("--enable-experimental")[0] == {"enable_experimental": True}


def test_hybridep_gathers_the_routing_map_and_casts_and_sums_its_token_counts():
    hybrid = QWEN.replace(moe_flex_dispatcher_backend="hybridep", moe_router_dtype="fp32")
    preprocessing = ["all_gather", "echo_tune.hybridep_scan", "echo_tune.hybridep_permute_preprocess"]
    assert _ops(hybrid, "dispatch_metadata") == preprocessing + ["aten._to_copy", "aten.sum"]
    assert _ops(hybrid, "preprocess") == []
    layer = trace_pieces(hybrid, LAYOUT, check_compatible(hybrid, H100, 8, LAYOUT))["moe_layer"]
    gather = next(op for op in layer.forward if op.subregion == "dispatch_metadata" and op.kind == "collective")
    assert gather.group == "ep" and gather.size_bytes == 4096 * 128 * 8  # [tokens, experts] bool from 8 ranks
    padded = hybrid.replace(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    assert _ops(padded, "dispatch_metadata") == preprocessing  # the counts are the capacity: nothing to sum


def test_the_host_waits_slow_a_host_bound_deepep_layer():
    eager, fused = (et.simulate(m, H100, 8, LAYOUT).step_time_s for m in (QWEN, QWEN.replace(enable_experimental=True)))
    assert eager > fused
    # no host: the chain's kernels alone, a few microseconds each
    from echo_tune.cost.host.host_time import without_host
    from echo_tune.sim.schedule.memo import profile_for_cluster
    gpu_only = without_host(profile_for_cluster(H100))
    e, f = (et.simulate(m, H100, 8, LAYOUT, profile=gpu_only).step_time_s
            for m in (QWEN, QWEN.replace(enable_experimental=True)))
    assert 0 < e - f < eager - fused
