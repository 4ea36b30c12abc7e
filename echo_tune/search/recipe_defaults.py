"""The recipe features the zero-YAML space searches (``echo-tune search --model ...``), and those it sets on.

Searched: the token dispatcher (alltoall, and flex with DeepEP or HybridEP where the GPU runs them; allgather, which
sends every token to every expert rank, when listed), the EP all-to-all overlap, the recomputed modules of
selective recompute, the FP8 recipe, delayed weight gradients with the EP overlap (on DeepSeek-V3's recipe layout
with the alltoall dispatcher the simulator has them 0.05% slower, so they are not set on). Balanced pipeline layouts (embedding, loss and MTP placed for the layer count,
search/pipeline_layouts.py) are searched when asked (``--layout pipeline_model_parallel_layout=auto``): in the
default they multiplied DeepSeek-V3 / 1024 H100's structures (34,704 -> 94,032 layouts) and the structure-first
search, at its 3,000-layout budget, then ended at 33.6 s instead of 21.2 s.

Set on where they apply, not enumerated, because the simulator models them as free (dominance: on is never slower
and never uses more memory; checked on sampled layouts of the benchmark spaces, tests/search/test_recipe_features.py):
the shared-expert overlap
where the EP overlap is off, the parameter all-gather overlapped with the optimizer step, the fused MoE router and
permutation. The fused cross-entropy loss is not among them: on Qwen3-30B-A3B / 16 H100 (PP2 VP12 EP8 mbs2) its
native kernel peaked 4.6 GiB higher than the unfused loss in the simulator (tests/search/test_recipe_features.py
found it); list it with ``--layout cross_entropy_loss_fusion=false,true``. A space file (or ``--layout FIELD=VALUES``) can list both values of
any of them.

CUDA graphs and TP-communication overlap: CUDA graphs are searched only when asked (``--layout
cuda_graph_impl=none,transformer_engine``), TP-communication overlap is searched off and on (auto_space.py).
"""

from __future__ import annotations

from echo_tune.search.feature_values import flex_runs_on

ALWAYS_ON = ("moe_shared_expert_overlap", "overlap_param_gather_with_optimizer_step",
             "moe_permute_fusion", "moe_router_fusion")
"""Features set on where they apply (see the module doc)."""


def recipe_features(model, cluster, fp8: bool) -> dict:
    """The space file's ``layout:`` entries of the recipe features for a model on a cluster (``fp8``: FP8 is
    searched)."""
    out: dict = {"recompute_modules": "auto", "overlap_param_gather_with_optimizer_step": True}
    if fp8:
        out["fp8_recipe"] = "auto"
    if model.is_moe:
        out.update({"moe_token_dispatcher_type": ["alltoall", "flex"] if flex_runs_on(cluster) else ["alltoall"],
                    "moe_flex_dispatcher_backend": "auto",
                    "overlap_moe_expert_parallel_comm": [False, True], "delay_wgrad_compute": [False, True],
                    "moe_permute_fusion": True, "moe_router_fusion": True})
        if model.moe_shared_expert_intermediate_size:
            out["moe_shared_expert_overlap"] = True
    return out
