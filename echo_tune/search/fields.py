"""The searched settings: their drawing order and their kinds of value (search-space files, ``space.py``)."""

# Searched settings in the order layouts are drawn (see layouts.py): each later choice may depend on
# the earlier ones. "num_gpus" is the world size; the rest are ParallelConfig fields (Megatron names).
FIELD_ORDER = (
    "num_gpus",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
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
    "use_distributed_optimizer",
    "overlap_param_gather",
    "overlap_grad_reduce",
    "fp8_format",
    "fp8_param_gather",
)
LAYOUT_FIELDS = FIELD_ORDER[1:]
BOOL_FIELDS = ("sequence_parallel", "tp_comm_overlap", "use_distributed_optimizer", "overlap_param_gather",
               "overlap_grad_reduce", "fp8_param_gather", "account_for_embedding_in_pipeline_split",
               "account_for_loss_in_pipeline_split")
OPTIONAL_INT_FIELDS = ("expert_tensor_parallel_size", "decoder_first_pipeline_num_layers",
                       "decoder_last_pipeline_num_layers",
                       "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
                       "recompute_num_layers")
NONE_WORDS = ("none", "null", "off")
