"""The recipe features the zero-YAML space searches (``echo-tune search --model ...``), and those it sets on.

Searched: the token dispatcher (alltoall, and flex with DeepEP or HybridEP where the GPU runs them; allgather, which
sends every token to every expert rank, when listed), the EP all-to-all overlap, delayed weight gradients with it
(on DeepSeek-V3's recipe layout with the alltoall dispatcher the simulator has them 0.05% slower, so they are not
set on), the recomputed modules of selective recompute, the FP8 recipe, and for a model with MTP layers the
balanced pipeline layouts (embedding, MTP and loss placed for the layer count, search/space/pipeline_layouts.py: the
split settings cannot place MTP; DeepSeek-V3 / 1024 H100 went from 21.26 s to 19.79 s with them, docs/search.md).

Set on where they apply, not enumerated, because the simulator models them as free (dominance: on is never slower
and never uses more memory; tests/search/test_recipe_features.py simulates each off and on): the shared-expert
overlap where the EP overlap is off, the parameter all-gather overlapped with the optimizer step, the fused MoE
router and permutation. The fused cross-entropy loss is not among them: on Qwen3-30B-A3B / 16 H100 (PP2 VP12 EP8
mbs2) its native kernel peaked 4.6 GiB higher than the unfused loss in the simulator (the test found it); list it
with ``--layout cross_entropy_loss_fusion=false,true``. A space file (or ``--layout FIELD=VALUES``) can list both
values of any of them.

CUDA graphs (TE-scoped: attention, and attention with the MoE router and dispatch preprocessing) are searched off and
on for MoE models, whose recipes capture them (Megatron-Bridge's Qwen3 / DeepSeek-V3 / GPT-OSS recipes of 2026: the
router and preprocessing): an MoE layer issues a GEMM per local expert from Python, and a captured module costs the
host one launch (cost/host/host_bound.py), so for Qwen3-30B-A3B on 16 H100 (GBS 1,024) the graphs take the best
layout from 25.8 s to 18.7 s, TP1 EP16 HybridEP with the EP overlap, NVIDIA's July 2026 recipe (measured 20.99 s).
For dense models they are searched only when asked (``--layout cuda_graph_impl=none,transformer_engine``, with their
modules). TP-communication overlap is searched off and on (auto_space.py).
"""

from __future__ import annotations

from echo_tune.search.space.feature_values import flex_runs_on

ALWAYS_ON = ("moe_shared_expert_overlap", "overlap_param_gather_with_optimizer_step",
             "moe_permute_fusion", "moe_router_fusion")
"""Features set on where they apply (see the module doc)."""


def recipe_features(model, cluster, fp8: bool) -> dict:
    """The space file's ``layout:`` entries of the recipe features for a model on a cluster (``fp8``: FP8 is
    searched)."""
    out: dict = {"recompute_modules": "auto", "overlap_param_gather_with_optimizer_step": True}
    if model.mtp_num_layers:  # MTP placed by a layout; without MTP the split settings place E and L already
        out["pipeline_model_parallel_layout"] = "auto"
    if fp8:
        out["fp8_recipe"] = "auto"
    if model.is_moe:
        out.update({"moe_token_dispatcher_type": ["alltoall", "flex"] if flex_runs_on(cluster) else ["alltoall"],
                    "moe_flex_dispatcher_backend": "auto",
                    "overlap_moe_expert_parallel_comm": [False, True], "delay_wgrad_compute": [False, True],
                    "moe_permute_fusion": True, "moe_router_fusion": True,
                    "cuda_graph_impl": ["none", "transformer_engine"], "cuda_graph_modules": "auto"})
        if model.moe_shared_expert_intermediate_size:
            out["moe_shared_expert_overlap"] = True
    return out
