"""Expert parallelism: Megatron-Core's rules for EP / ETP and where the expert groups sit.

"Parallel folding" (megatron/core/parallel_state.py, ``initialize_model_parallel``, NVIDIA/Megatron-LM
commit d98e8a64ddf3): the expert layers use their own rank generator over the same ranks as the
attention part, order ``tp-ep-dp-pp`` with tp = ETP, ep = EP, dp = expert-data-parallel and cp = 1.
Pipeline parallelism is outermost in both, so within one pipeline stage the TP x CP x DP ranks of
the attention part are re-cut as ETP (innermost) x EP x EDP, and
``expert_data_parallel_size = TP * CP * DP / (ETP * EP)``.
"""

from __future__ import annotations

from echo_tune.config._checks import require
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.rules.moe_overlap_rules import check_moe_overlap
from echo_tune.config.specs.parallel import ParallelConfig


def placements(sizes: list[tuple[str, int]], gpus_per_node: int, group_cls) -> dict:
    """Placement of groups laid out innermost first (each group's stride is the product of earlier sizes)."""
    out, stride = {}, 1
    for kind, size in sizes:
        per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
        out[kind] = group_cls(size=size, ranks_per_node=per_node, num_nodes=-(-size // per_node))
        stride *= size
    return out


def expert_groups(model: ModelSpec, parallel: ParallelConfig, dp: int, gpus_per_node: int, group_cls) -> dict:
    """Check every EP / ETP rule; return the placements of the ep, etp, tpep (ETP x EP) and edp groups."""
    check_moe_overlap(model, parallel)
    ep, etp = parallel.expert_model_parallel_size, parallel.expert_tensor_size
    tp, cp = parallel.tensor_model_parallel_size, parallel.context_parallel_size
    if not model.is_moe:
        require(ep == 1, f"`expert_model_parallel_size > 1` needs an MoE model (num_experts), but got "
                         f"(expert_model_parallel_size={ep}, num_experts=None)")
        one = group_cls(size=1, ranks_per_node=1, num_nodes=1)
        return {"ep": one, "etp": one, "tpep": one, "edp": one}
    e = model.num_experts
    require(e % ep == 0, f"`num_experts % expert_model_parallel_size == 0` must hold, but got (num_experts={e}, "
                         f"expert_model_parallel_size={ep}); use an EP size that divides {e}")
    folded = tp * cp * dp
    require(folded % (etp * ep) == 0,
            f"`(tensor_model_parallel_size * context_parallel_size * data_parallel_size) % "
            f"(expert_tensor_parallel_size * expert_model_parallel_size) == 0` must hold (expert groups are "
            f"carved from those ranks), but got (TP*CP*DP={folded}, expert_tensor_parallel_size={etp}, "
            f"expert_model_parallel_size={ep})")
    require(model.moe_ffn_size % etp == 0,
            f"`moe_ffn_hidden_size % expert_tensor_parallel_size == 0` must hold, but got "
            f"(moe_ffn_hidden_size={model.moe_ffn_size}, expert_tensor_parallel_size={etp})")
    shared = model.moe_shared_expert_intermediate_size
    require(not shared or shared % tp == 0,
            f"`moe_shared_expert_intermediate_size % tensor_model_parallel_size == 0` must hold, but got "
            f"(moe_shared_expert_intermediate_size={shared}, tensor_model_parallel_size={tp})")
    # transformer_config.py: "Bias in Moe is only supported when ETP==1"
    require(not model.add_bias_linear or etp == 1,
            f"MoE with linear biases needs `expert_tensor_parallel_size == 1`, but got "
            f"(add_bias_linear=True, expert_tensor_parallel_size={etp}); add --disable-bias-linear or set ETP 1")
    # megatron/core/transformer/moe/moe_layer.py refuses to train MoE with TP > 1 without sequence parallelism
    require(tp == 1 or parallel.sequence_parallel,
            f"MoE with `tensor_model_parallel_size > 1` needs sequence_parallel (Megatron-Core's MoE layer), but got "
            f"(tensor_model_parallel_size={tp}, sequence_parallel=False); add --sequence-parallel")
    if model.use_transformer_engine_op_fuser and model.moe_grouped_gemm:
        # moe/experts.py _is_fused_impl_supported (asserted with the op fuser): no expert TP, no probabilities on
        # the input, a SwiGLU / quick-GeGLU / weighted squared-ReLU activation
        require(etp == 1 and not model.moe_apply_probs_on_input and (model.swiglu or model.squared_relu),
                f"the TE op fuser's grouped MLP needs expert_tensor_parallel_size 1, no moe_apply_probs_on_input and "
                f"a SwiGLU or squared-ReLU activation, but got (expert_tensor_parallel_size={etp}, "
                f"moe_apply_probs_on_input={model.moe_apply_probs_on_input}, swiglu={model.swiglu}); change those "
                f"or drop --use-transformer-engine-op-fuser")
    edp = folded // (etp * ep)
    order = [("etp", etp), ("ep", ep), ("edp", edp)]
    if parallel.use_tp_pp_dp_mapping and parallel.pipeline_model_parallel_size > 1:
        # order tp-cp-ep-pp-dp for both rank generators; parallel_state.py asserts they give the same
        # pipeline groups, so the pp stride must match: ETP x EP == TP x CP, and EDP lies outside PP
        require(etp * ep == tp * cp,
                f"`expert_tensor_parallel_size * expert_model_parallel_size == tensor_model_parallel_size * "
                f"context_parallel_size` must hold with use_tp_pp_dp_mapping (same pipeline groups for both "
                f"rank generators), but got (ETP*EP={etp * ep}, TP*CP={tp * cp}); change EP or drop the mapping")
        order.insert(2, ("pp", parallel.pipeline_model_parallel_size))
    out = placements(order, gpus_per_node, group_cls)
    out.pop("pp", None)
    return out | \
        {"tpep": placements([("tpep", etp * ep)], gpus_per_node, group_cls)["tpep"]}
