"""The router as Megatron-Core's TopKRouter runs it (workload/mlp/moe_router.py): which kernels each option adds to a
traced MoE layer's router (issue 37, item 2)."""

import pytest

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.passes import trace_pieces

QWEN = et.load_model("qwen3-30b-a3b").replace(moe_router_fusion=False, moe_router_dtype=None)
H100 = et.load_cluster("h100-sxm")
LAYOUT = et.ParallelConfig(expert_model_parallel_size=8, micro_batch_size=1, global_batch_size=8,
                           use_distributed_optimizer=True)


def _router_ops(model, phase="fwd"):
    layer = trace_pieces(model, LAYOUT, check_compatible(model, H100, 8, LAYOUT))["moe_layer"]
    return [op.name for op in (layer.forward if phase == "fwd" else layer.backward) if op.subregion.startswith("router")]


def test_flags():
    model, _, _, _ = parse_megatron_line("--moe-aux-loss-coeff 1e-3 --moe-z-loss-coeff 1e-3 "
                                         "--moe-router-score-function sigmoid --moe-router-enable-expert-bias "
                                         "--moe-router-topk-scaling-factor 2.5")
    assert model == {"moe_aux_loss_coeff": "1e-3", "moe_z_loss_coeff": 1e-3, "moe_router_score_function": "sigmoid",
                     "moe_router_enable_expert_bias": True, "moe_router_topk_scaling_factor": 2.5}
    with pytest.raises(ConfigError, match="moe_router_score_function"):
        QWEN.replace(moe_router_score_function="tanh")
    with pytest.raises(ConfigError, match="moe_aux_loss_coeff"):
        QWEN.replace(moe_aux_loss_coeff="-1")


def test_each_option_adds_its_kernels():
    plain = QWEN.replace(moe_aux_loss_coeff=0.0)
    base = _router_ops(plain)
    assert base == ["aten.mm", "aten._softmax", "aten.topk"]  # logits, softmax, top-k
    aux = _router_ops(plain.replace(moe_aux_loss_coeff=1e-3))
    # the aux loss: scores again, their top-k as a routing map, tokens per expert x summed scores
    assert aux[:3] == base and aux.count("aten._softmax") == 2 and "aten.scatter" in aux
    assert len(_router_ops(plain.replace(moe_aux_loss_coeff=1e-3), "bwd")) > len(_router_ops(plain, "bwd"))
    assert "aten.logsumexp" in _router_ops(plain.replace(moe_z_loss_coeff=1e-3))
    sigmoid = _router_ops(plain.replace(moe_router_score_function="sigmoid"))
    assert sigmoid[:4] == ["aten.mm", "aten.sigmoid", "aten.topk", "aten.gather"] and "aten.div" in sigmoid
    bias = _router_ops(plain.replace(moe_router_enable_expert_bias=True))
    assert bias[:3] == ["aten.mm", "aten._softmax", "aten.add"]  # the bias added before the top-k


def test_the_kernels_megatron_keeps_outside_the_fusion():
    """Megatron-LM d98e8a64 with --moe-router-fusion, aux loss, forced balancing: 10 forward kernels (the gating
    GEMM, the random logits' copy and fill, TE's three fused chains, the tokens-per-expert count, the logged loss's
    division, add and copy), counted in Megatron's own code by benchmarks/megatron_host_ops.py (25 unfused, 18 of
    them inside the three fused chains)."""
    model = QWEN.replace(moe_router_fusion=True, moe_aux_loss_coeff=1e-3, moe_router_force_load_balancing=True)
    layer = trace_pieces(model, LAYOUT, check_compatible(model, H100, 8, LAYOUT))["moe_layer"]
    router = [op for op in layer.forward if op.subregion.startswith("router")]
    assert [op.subregion for op in router if op.subregion != "router"] and \
        sorted({op.subregion for op in router}) == ["router", "router_aux_loss", "router_aux_scores", "router_topk"]
    from echo_tune.cost.kernels.moe_fusion import fuse_memory_runs, fused_subregions
    fused = [op.name for op in fuse_memory_runs(tuple(router), fused_subregions(True, False))]
    assert fused == ["aten.mm", "aten.clone", "aten.normal_", "fused_router_topk", "fused_router_aux_scores",
                     "aten.sum", "fused_router_aux_loss", "aten.div", "aten.copy_", "aten.add_"]


def test_unfused_routers_cost_more_with_the_losses():
    plain = et.simulate(QWEN.replace(moe_aux_loss_coeff=0.0), H100, 8, LAYOUT).step_time_s
    lossy = et.simulate(QWEN.replace(moe_aux_loss_coeff=1e-3, moe_z_loss_coeff=1e-3), H100, 8, LAYOUT).step_time_s
    assert lossy > plain
