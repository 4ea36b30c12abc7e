"""The recipe features a layout can switch on beside its structure: which apply where, and the model a layout runs.

Megatron-Bridge's recipes win with settings that are neither parallel sizes nor batch sizes: the EP all-to-all
overlap with delayed weight gradients, the token dispatcher (alltoall, allgather, flex with DeepEP or HybridEP),
the recomputed modules, CUDA graphs, a pipeline layout, the FP8 recipe, the shared-expert overlap, the parameter
all-gather overlapped with the optimizer step and the fused MoE / loss kernels. Each is a searched setting
(``fields.FIELD_ORDER``); a setting that cannot change the step given the settings before it takes its off value
(``feature_applies``), as ``layouts.applicable`` does for the others, so no layout is listed twice. Megatron's own
rules for each (``check_compatible``) decide the rest.

The dispatcher, the shared-expert overlap and the fusions are ModelSpec fields (Megatron-LM d98e8a64ddf3
transformer_config.py): ``model_of`` is the space's model with a layout's values of them.
"""

from __future__ import annotations

from echo_tune.config.specs.model import ModelSpec
from echo_tune.identity_cache import IdentityCache
from echo_tune.search.space.fields import MODEL_LAYOUT_FIELDS
from echo_tune.config.specs.pipeline_layout import num_virtual_stages

FEATURE_FIELDS = ("recompute_modules", "overlap_param_gather_with_optimizer_step", "fp8_recipe",
                  "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "overlap_moe_expert_parallel_comm",
                  "delay_wgrad_compute", "moe_shared_expert_overlap", "cuda_graph_impl", "cuda_graph_modules",
                  "moe_permute_fusion", "moe_router_fusion", "cross_entropy_loss_fusion")
OVERLAP_DISPATCHERS = ("alltoall", "flex")
"""Dispatchers the EP overlap and the shared-expert overlap run with (config/rules/moe_overlap_rules.py, moe_fields.py)."""


def _dispatcher(chosen: dict, model: ModelSpec | None) -> str:
    default = model.moe_token_dispatcher_type if model is not None else "alltoall"
    return chosen.get("moe_token_dispatcher_type", default)


def interleaved(chosen: dict) -> bool:
    """Whether the chosen pipeline runs several chunks per stage (VPP, or a layout of more chunks than stages)."""
    pp = chosen.get("pipeline_model_parallel_size", 1)
    if pp <= 1:
        return False
    if chosen.get("virtual_pipeline_model_parallel_size") or chosen.get("num_layers_per_virtual_pipeline_stage"):
        return True
    layout = chosen.get("pipeline_model_parallel_layout")
    if layout:

        return num_virtual_stages(layout) > pp
    return False


def feature_applies(field_name: str, chosen: dict, model: ModelSpec | None) -> bool:
    """Whether a FEATURE_FIELDS setting changes the step, given the settings chosen before it (``model`` None:
    the model's part of the rule is taken to hold)."""
    moe = model is None or model.is_moe
    ep = chosen.get("expert_model_parallel_size", 1)
    if field_name == "recompute_modules":
        return chosen.get("recompute_granularity") == "selective"
    if field_name == "overlap_param_gather_with_optimizer_step":  # training/arguments.py validate_args
        return bool(chosen.get("use_distributed_optimizer") and chosen.get("overlap_param_gather")) \
            and interleaved(chosen)
    if field_name == "fp8_recipe":
        return chosen.get("fp8_format") is not None
    if field_name == "moe_token_dispatcher_type":  # tokens leave the rank only with EP or expert TP
        etp = chosen.get("expert_tensor_parallel_size") or chosen.get("tensor_model_parallel_size", 1)
        return moe and (ep > 1 or etp > 1)
    if field_name == "moe_flex_dispatcher_backend":
        return moe and _dispatcher(chosen, model) == "flex"
    if field_name == "overlap_moe_expert_parallel_comm":  # config/rules/moe_overlap_rules.py
        return moe and ep > 1 and _dispatcher(chosen, model) in OVERLAP_DISPATCHERS \
            and chosen.get("recompute_granularity") != "full" \
            and (chosen.get("pipeline_model_parallel_size", 1) == 1 or interleaved(chosen))
    if field_name == "delay_wgrad_compute":
        return bool(chosen.get("overlap_moe_expert_parallel_comm"))
    if field_name == "moe_shared_expert_overlap":  # excludes the EP overlap (moe_overlap_rules.py)
        shared = model is None or bool(model.moe_shared_expert_intermediate_size)
        return moe and shared and _dispatcher(chosen, model) in OVERLAP_DISPATCHERS \
            and not chosen.get("overlap_moe_expert_parallel_comm")
    if field_name == "cuda_graph_modules":
        return chosen.get("cuda_graph_impl") in ("local", "transformer_engine")
    if field_name in ("moe_permute_fusion", "moe_router_fusion"):
        return moe
    return True  # cuda_graph_impl, cross_entropy_loss_fusion


_MODELS = IdentityCache(limit=256)  # (the space's model, the changed values) -> the changed model


def model_of(space, chosen: dict) -> ModelSpec:
    """The space's model with the MODEL_LAYOUT_FIELDS values ``chosen`` gives (the space's own object when they
    are its values; one object per set of values, so the simulator's caches keyed on the model are shared)."""
    base = space.model
    changes = tuple((f, chosen[f]) for f in MODEL_LAYOUT_FIELDS if f in chosen and chosen[f] != getattr(base, f))
    if not changes:
        return base
    return _MODELS.get((base,), changes, lambda: base.replace(**dict(changes)))
