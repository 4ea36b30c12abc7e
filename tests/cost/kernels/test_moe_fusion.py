"""Fused router / permutation kernels: a chain of memory-bound ops becomes one kernel."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.cost.kernels.moe_fusion import fuse_memory_runs, fused_subregions
from echo_tune.workload.graph import Op


def _mem(sub, nbytes, region="moe"):
    return Op(name=f"m{nbytes}", kind="memory", phase="fwd", region=region, subregion=sub, bytes=nbytes, key="k")


def test_runs_of_a_fused_subregion_collapse_to_their_largest_op():
    gemm = Op(name="mm", kind="gemm", phase="fwd", region="moe", subregion="router", flops=1.0)
    ops = (_mem("router", 10), gemm, _mem("router_topk", 3), _mem("router_topk", 7), _mem("router_topk", 5),
           _mem("router", 2), _mem("router_aux_loss", 4), _mem("router_aux_loss", 1),
           _mem("dispatch", 40), _mem("dispatch", 20), _mem("experts", 9), _mem("", 8, region="mlp_norm"))
    fused = fuse_memory_runs(ops, fused_subregions(router_fusion=True, permute_fusion=False))
    # the router's own kernels stay (TE fuses none of them); each fused chain becomes one kernel of its largest op's
    # bytes; dispatch unfused
    assert [op.bytes for op in fused] == [10, 0.0, 7, 2, 4, 40, 20, 9, 8]
    assert fused[2].name == "fused_router_topk" and fused[2].key == ""  # a new kernel: not in an op-time database
    both = fuse_memory_runs(ops, fused_subregions(router_fusion=True, permute_fusion=True))
    assert [op.bytes for op in both] == [10, 0.0, 7, 2, 4, 40, 9, 8]
    assert fuse_memory_runs(ops, fused_subregions(False, False)) == ops


def test_fusion_shortens_the_moe_layer_only():
    h100 = et.load_cluster("h100-sxm")
    model = et.load_model("qwen3-30b-a3b").replace(num_layers=4, seq_length=1024)
    layout = et.ParallelConfig(expert_model_parallel_size=8, global_batch_size=64)
    plain = et.simulate(model, h100, 8, layout)
    fused = et.simulate(model.replace(moe_router_fusion=True, moe_permute_fusion=True), h100, 8, layout)
    assert fused.breakdown_s["compute"] < plain.breakdown_s["compute"]
    assert fused.breakdown_s["ep_comm"] == pytest.approx(plain.breakdown_s["ep_comm"])
