"""The searched settings: their drawing order and their kinds of value (search-space files, ``space.py``)."""

# Searched settings in the order layouts are drawn (see layouts.py): each later choice may depend on
# the earlier ones. "num_gpus" is the world size; the rest are ParallelConfig fields (Megatron names), but for
# MODEL_LAYOUT_FIELDS, ModelSpec fields that are launch choices rather than architecture (the MoE dispatcher,
# the shared-expert overlap, fused kernels): a layout that sets them simulates the model with them changed.
FIELD_ORDER = (
    "num_gpus",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "pipeline_model_parallel_layout",
    "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "micro_batch_size",
    "virtual_pipeline_model_parallel_size",
    "num_layers_per_virtual_pipeline_stage",
    "sequence_parallel",
    "tp_comm_overlap",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "use_distributed_optimizer",
    "overlap_param_gather",
    "overlap_grad_reduce",
    "overlap_param_gather_with_optimizer_step",
    "fp8_format",
    "fp8_param_gather",
    "fp8_recipe",
    "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend",
    "overlap_moe_expert_parallel_comm",
    "delay_wgrad_compute",
    "moe_shared_expert_overlap",
    "cuda_graph_impl",
    "cuda_graph_modules",
    "moe_permute_fusion",
    "moe_router_fusion",
    "cross_entropy_loss_fusion",
)
LAYOUT_FIELDS = FIELD_ORDER[1:]
MODEL_LAYOUT_FIELDS = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_shared_expert_overlap",
                       "moe_permute_fusion", "moe_router_fusion", "cross_entropy_loss_fusion")
"""ModelSpec fields searched as settings of the launch (their default in a space: the model's own value)."""
BOOL_FIELDS = ("sequence_parallel", "tp_comm_overlap", "use_distributed_optimizer", "overlap_param_gather",
               "overlap_grad_reduce", "fp8_param_gather", "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split", "overlap_param_gather_with_optimizer_step",
               "overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "moe_shared_expert_overlap",
               "moe_permute_fusion", "moe_router_fusion", "cross_entropy_loss_fusion")
OPTIONAL_INT_FIELDS = ("expert_tensor_parallel_size", "decoder_first_pipeline_num_layers",
                       "decoder_last_pipeline_num_layers",
                       "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
                       "recompute_num_layers")
WORD_FIELDS = ("recompute_granularity", "recompute_method", "fp8_format", "fp8_recipe", "moe_token_dispatcher_type",
               "moe_flex_dispatcher_backend", "cuda_graph_impl", "pipeline_model_parallel_layout")
"""Settings whose values are words (checked by ParallelConfig / ModelSpec)."""
MODULE_SET_FIELDS = ("recompute_modules", "cuda_graph_modules")
"""Settings that take a set of module names: a space lists each set as one word, its names joined by spaces
(``mla_up_proj mlp``; Optuna's categorical choices are plain values), turned into Megatron's list when a layout
is built (``module_set``)."""
NONE_WORDS = ("none", "null", "off")


def module_choice(value) -> str | None:
    """A module set (a list, a tuple, or names joined by spaces or ``+``) as the one word a space lists."""
    if value is None:
        return None
    names = value.replace("+", " ").split() if isinstance(value, str) else [str(v) for v in value]
    return " ".join(names) if names else None


def module_set(choice: str | None) -> tuple[str, ...] | None:
    """The listed word of a module set as Megatron's list of names (None: the setting unset)."""
    return tuple(choice.split()) if choice else None
