"""The dropless all-to-all dispatcher's metadata step (workload/mlp/dispatch_preprocess.py): the kernels Megatron-LM
d98e8a64 runs before it moves a token, counted in its own code by benchmarks/megatron_host_ops.py (5 sums, 1 copy,
1 all-gather, 5 device-to-host copies forward, nothing backward)."""

from collections import Counter

import pytest

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.cost.host.host_bound import DTOH_OP
from echo_tune.cost.host.host_time import without_host
from echo_tune.sim.schedule.costing import CostContext, host_issue_s, phase_cost
from echo_tune.sim.schedule.memo import profile_for_cluster as profile_for
from echo_tune.sim.schedule.passes import trace_pieces

QWEN = et.load_model("qwen3-30b-a3b").replace(num_layers=2, moe_router_fusion=True, moe_permute_fusion=True)
H100 = et.load_cluster("h100-sxm")
LAYOUT = et.ParallelConfig(expert_model_parallel_size=8, micro_batch_size=1, global_batch_size=8,
                           use_distributed_optimizer=True)


def _layer(model, layout=LAYOUT):
    return trace_pieces(model, layout, check_compatible(model, H100, 8, layout))["moe_layer"]


def _preprocess(layer, phase="fwd"):
    return [op.collective or op.name for op in (layer.forward if phase == "fwd" else layer.backward)
            if op.subregion == "preprocess"]


def test_the_dropless_all_to_all_runs_megatrons_metadata_kernels_forward_only():
    layer = _layer(QWEN)
    assert Counter(_preprocess(layer)) == {"aten.sum": 5, "aten.clone": 1, "all_gather": 1, DTOH_OP: 5}
    assert _preprocess(layer, "bwd") == []
    gather = next(op for op in layer.forward if op.subregion == "preprocess" and op.kind == "collective")
    assert gather.group == "tpep" and gather.size_bytes == 8 * 128 * 8  # int64 counts of 128 experts from 8 ranks
    # before the dispatch: the host waits for these copies at the all-to-all (sim/schedule/costing.py)
    names = [op.subregion for op in layer.forward if op.region == "moe"]
    assert names.index("preprocess") < names.index("dispatch")


def test_no_metadata_step_where_megatron_skips_it():
    padded = QWEN.replace(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    assert _preprocess(_layer(padded)) == []  # drop-and-pad: the counts are the capacity, nothing to the host
    flex = QWEN.replace(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep")
    assert _preprocess(_layer(flex)) == []  # HybridEP: its own preprocessing, inside its call
    deepep = flex.replace(moe_flex_dispatcher_backend="deepep")
    assert _preprocess(_layer(deepep)) == ["aten.topk"]  # DeepEP's setup_metadata (flex_metadata.py), no counts
    one_rank = LAYOUT.replace(expert_model_parallel_size=1)
    assert _preprocess(_layer(QWEN, one_rank)) == []


def test_the_copies_to_the_host_cost_the_host_not_the_compute_stream():
    layout = check_compatible(QWEN, H100, 8, LAYOUT)
    profile = profile_for(H100)
    ctx = CostContext(profile=profile, gpu=H100.gpu, precision="bf16", groups=layout.groups)
    gpu_only = CostContext(profile=without_host(profile), gpu=H100.gpu, precision="bf16", groups=layout.groups)
    copies = tuple(op for op in _layer(QWEN).forward if op.name == DTOH_OP)
    assert len(copies) == 5 and phase_cost(copies, gpu_only).compute_s == 0.0  # on their own stream
    assert host_issue_s(copies, ctx) == pytest.approx(5 * profile.host_time_per_kernel_s)  # a Python call each
    # alone, the GPU has nothing to run while the host issues them: it waits for all five calls
    assert phase_cost(copies, ctx).compute_s == pytest.approx(5 * profile.host_time_per_kernel_s)


def test_graphs_of_the_metadata_step_save_its_host_calls():
    model = QWEN
    plain = et.simulate(model, H100, 8, LAYOUT)
    graphed = et.simulate(model, H100, 8, LAYOUT.replace(cuda_graph_impl="transformer_engine",
                                                         cuda_graph_scope=("moe_router", "moe_preprocess")))
    router_only = et.simulate(model, H100, 8, LAYOUT.replace(cuda_graph_impl="transformer_engine",
                                                             cuda_graph_scope=("moe_router",)))
    # capturing the metadata step with the router saves the host calls of its kernels (its all-gather stays a launch)
    assert graphed.step_time_s < router_only.step_time_s < plain.step_time_s
