"""Megatron-LM command-line flags echo-tune reads into a spec field: the tables, and nothing else.

config/launch/megatron_args.py parses and writes launch lines with them; config/flags/unmodelled.py classifies every other
flag of the catalogue against them, and config/launch/launch_notes.py reads the legacy layout switches among them.
Every flag here exists in Megatron-LM's ``megatron/training/arguments.py`` at d98e8a64ddf3
(``--num-virtual-stages-per-pipeline-rank`` is the flag behind ``args.virtual_pipeline_model_parallel_size``).
"""

from __future__ import annotations

# field -> (flag, kind). kind: "int", "float", "str", "flag" (store_true), "not_flag" (store_false),
# "freq" (an integer or a list expression, --moe-layer-freq), "list" (nargs="+"), "words" (nargs="+" read
# into one space-separated string: --moe-router-load-balancing-type), "window" (--window-size:
# "left,right" as Megatron's tuple_type reads it, or one number for (left, 0); layer_fields.parse_window_size),
# "ints" (nargs="+", type=int; a value holding spaces, as '2 2' from Megatron's functional-test YAML that its CI
# writes unquoted into the shell line, splits into its numbers).
MODEL_FLAGS: dict[str, tuple[str, str]] = {
    "num_layers": ("--num-layers", "int"),
    "hidden_size": ("--hidden-size", "int"),
    "num_attention_heads": ("--num-attention-heads", "int"),
    "num_query_groups": ("--num-query-groups", "int"),
    "ffn_hidden_size": ("--ffn-hidden-size", "int"),
    "kv_channels": ("--kv-channels", "int"),
    "seq_length": ("--seq-length", "int"),
    "vocab_size": ("--vocab-size", "int"),
    "make_vocab_size_divisible_by": ("--make-vocab-size-divisible-by", "int"),
    "swiglu": ("--swiglu", "flag"),
    "normalization": ("--normalization", "str"),
    "untie_embeddings_and_output_weights": ("--untie-embeddings-and-output-weights", "flag"),
    "attention_backend": ("--attention-backend", "str"),
    "mtp_num_layers": ("--mtp-num-layers", "int"),
    # MoE and MLA (config/specs/moe_fields.py)
    "num_experts": ("--num-experts", "int"),
    "moe_router_topk": ("--moe-router-topk", "int"),
    "moe_ffn_hidden_size": ("--moe-ffn-hidden-size", "int"),
    "moe_shared_expert_intermediate_size": ("--moe-shared-expert-intermediate-size", "int"),
    "moe_layer_freq": ("--moe-layer-freq", "freq"),
    "moe_router_load_balancing_type": ("--moe-router-load-balancing-type", "words"),
    "moe_token_dispatcher_type": ("--moe-token-dispatcher-type", "str"),
    "moe_grouped_gemm": ("--moe-grouped-gemm", "flag"),
    "moe_expert_capacity_factor": ("--moe-expert-capacity-factor", "float"),
    "moe_pad_expert_input_to_capacity": ("--moe-pad-expert-input-to-capacity", "flag"),
    "moe_router_dtype": ("--moe-router-dtype", "str"),
    "multi_latent_attention": ("--multi-latent-attention", "flag"),
    "q_lora_rank": ("--q-lora-rank", "int"),
    "kv_lora_rank": ("--kv-lora-rank", "int"),
    "qk_head_dim": ("--qk-head-dim", "int"),
    "qk_pos_emb_head_dim": ("--qk-pos-emb-head-dim", "int"),
    "v_head_dim": ("--v-head-dim", "int"),
    "qk_layernorm": ("--qk-layernorm", "flag"),
    "use_flash_attn": ("--use-flash-attn", "flag"),
    "position_embedding_type": ("--position-embedding-type", "str"),
    "add_bias_linear": ("--disable-bias-linear", "not_flag"),
    "hidden_dropout": ("--hidden-dropout", "float"),
    "attention_dropout": ("--attention-dropout", "float"),
    # attention / layer variants and kernel fusions (config/specs/layer_fields.py)
    "window_size": ("--window-size", "window"),
    "window_attn_skip_freq": ("--window-attn-skip-freq", "freq"),
    "softmax_type": ("--softmax-type", "str"),
    "rotary_percent": ("--rotary-percent", "float"),
    "rotary_interleaved": ("--rotary-interleaved", "flag"),
    "apply_layernorm_1p": ("--apply-layernorm-1p", "flag"),
    "squared_relu": ("--squared-relu", "flag"),
    "quick_geglu": ("--quick-geglu", "flag"),
    "apply_rope_fusion": ("--no-rope-fusion", "not_flag"),
    "bias_gelu_fusion": ("--no-bias-gelu-fusion", "not_flag"),
    "bias_swiglu_fusion": ("--no-bias-swiglu-fusion", "not_flag"),
    "bias_dropout_fusion": ("--no-bias-dropout-fusion", "not_flag"),
    "no_persist_layer_norm": ("--no-persist-layer-norm", "flag"),
    "cross_entropy_loss_fusion": ("--cross-entropy-loss-fusion", "flag"),
    "cross_entropy_fusion_impl": ("--cross-entropy-fusion-impl", "str"),
    "transformer_impl": ("--transformer-impl", "str"),
    "masked_softmax_fusion": ("--no-masked-softmax-fusion", "not_flag"),
    "attention_softmax_in_fp32": ("--attention-softmax-in-fp32", "flag"),
    "apply_query_key_layer_scaling": ("--apply-query-key-layer-scaling", "flag"),
    "attention_output_gate": ("--attention-output-gate", "flag"),
    "use_transformer_engine_op_fuser": ("--use-transformer-engine-op-fuser", "flag"),
    # the gated delta net layers (config/specs/linear_attention_fields.py, workload/attention/gated_delta_net.py)
    "experimental_attention_variant": ("--experimental-attention-variant", "str"),
    "linear_attention_freq": ("--linear-attention-freq", "freq"),
    "linear_conv_kernel_dim": ("--linear-conv-kernel-dim", "int"),
    "linear_key_head_dim": ("--linear-key-head-dim", "int"),
    "linear_value_head_dim": ("--linear-value-head-dim", "int"),
    "linear_num_key_heads": ("--linear-num-key-heads", "int"),
    "linear_num_value_heads": ("--linear-num-value-heads", "int"),
    # MoE dispatch kernels and routing options (cost/collectives/moe_dispatch.py, sim/features/moe_overlap.py)
    "moe_flex_dispatcher_backend": ("--moe-flex-dispatcher-backend", "str"),
    "moe_enable_deepep": ("--moe-enable-deepep", "flag"),
    "moe_flex_dispatcher_num_sms": ("--moe-flex-dispatcher-num-sms", "int"),
    "moe_shared_expert_overlap": ("--moe-shared-expert-overlap", "flag"),
    "moe_shared_expert_gate": ("--moe-shared-expert-gate", "flag"),
    "moe_router_fusion": ("--moe-router-fusion", "flag"),
    "moe_permute_fusion": ("--moe-permute-fusion", "flag"),
    "enable_experimental": ("--enable-experimental", "flag"),
    "moe_apply_probs_on_input": ("--moe-apply-probs-on-input", "flag"),
    "moe_router_num_groups": ("--moe-router-num-groups", "int"),
    "moe_router_group_topk": ("--moe-router-group-topk", "int"),
    "moe_router_force_load_balancing": ("--moe-router-force-load-balancing", "flag"),
    "moe_aux_loss_coeff": ("--moe-aux-loss-coeff", "words"),
    "moe_z_loss_coeff": ("--moe-z-loss-coeff", "float"),
    "moe_router_score_function": ("--moe-router-score-function", "str"),
    "moe_router_enable_expert_bias": ("--moe-router-enable-expert-bias", "flag"),
    "moe_router_topk_scaling_factor": ("--moe-router-topk-scaling-factor", "float"),
    # what a launch line needs to rebuild the model, not simulated (config/specs/rebuild_fields.py)
    "add_qkv_bias": ("--add-qkv-bias", "flag"),
    "rotary_base": ("--rotary-base", "int"),
    "norm_epsilon": ("--norm-epsilon", "float"),
    "use_rope_scaling": ("--use-rope-scaling", "flag"),
    "rope_scaling_factor": ("--rope-scaling-factor", "float"),
    "rotary_scaling_factor": ("--rotary-scaling-factor", "float"),
    "mscale": ("--mscale", "float"),
    "mscale_all_dim": ("--mscale-all-dim", "float"),
    "max_position_embeddings": ("--max-position-embeddings", "int"),
}
PARALLEL_FLAGS: dict[str, tuple[str, str]] = {
    "tensor_model_parallel_size": ("--tensor-model-parallel-size", "int"),
    "pipeline_model_parallel_size": ("--pipeline-model-parallel-size", "int"),
    "context_parallel_size": ("--context-parallel-size", "int"),
    "expert_model_parallel_size": ("--expert-model-parallel-size", "int"),
    "expert_tensor_parallel_size": ("--expert-tensor-parallel-size", "int"),
    "virtual_pipeline_model_parallel_size": ("--num-virtual-stages-per-pipeline-rank", "int"),
    "num_layers_per_virtual_pipeline_stage": ("--num-layers-per-virtual-pipeline-stage", "int"),
    "decoder_first_pipeline_num_layers": ("--decoder-first-pipeline-num-layers", "int"),
    "decoder_last_pipeline_num_layers": ("--decoder-last-pipeline-num-layers", "int"),
    "account_for_embedding_in_pipeline_split": ("--account-for-embedding-in-pipeline-split", "flag"),
    "account_for_loss_in_pipeline_split": ("--account-for-loss-in-pipeline-split", "flag"),
    "micro_batch_size": ("--micro-batch-size", "int"),
    "global_batch_size": ("--global-batch-size", "int"),
    "recompute_granularity": ("--recompute-granularity", "str"),
    "recompute_method": ("--recompute-method", "str"),
    "recompute_num_layers": ("--recompute-num-layers", "int"),
    "recompute_modules": ("--recompute-modules", "list"),
    "sequence_parallel": ("--sequence-parallel", "flag"),
    "use_distributed_optimizer": ("--use-distributed-optimizer", "flag"),
    "overlap_grad_reduce": ("--overlap-grad-reduce", "flag"),
    "overlap_param_gather": ("--overlap-param-gather", "flag"),
    "tp_comm_overlap": ("--tp-comm-overlap", "flag"),
    "grad_reduce_in_bf16": ("--grad-reduce-in-bf16", "flag"),
    "use_precision_aware_optimizer": ("--use-precision-aware-optimizer", "flag"),
    "main_params_dtype": ("--main-params-dtype", "str"),
    "exp_avg_dtype": ("--exp-avg-dtype", "str"),
    "main_grads_dtype": ("--main-grads-dtype", "str"),
    "exp_avg_sq_dtype": ("--exp-avg-sq-dtype", "str"),
    "fp8_format": ("--fp8-format", "str"),
    "fp8_recipe": ("--fp8-recipe", "str"),
    "fp8_param_gather": ("--fp8-param-gather", "flag"),
    "reuse_grad_buf_for_mxfp8_param_ag": ("--reuse-grad-buf-for-mxfp8-param-ag", "flag"),
    "fp4_format": ("--fp4-format", "str"),
    "fp4_recipe": ("--fp4-recipe", "str"),
    "first_last_layers_bf16": ("--first-last-layers-bf16", "flag"),
    "num_layers_at_start_in_bf16": ("--num-layers-at-start-in-bf16", "int"),
    "num_layers_at_end_in_bf16": ("--num-layers-at-end-in-bf16", "int"),
    "gradient_accumulation_fusion": ("--no-gradient-accumulation-fusion", "not_flag"),
    "async_tensor_model_parallel_allreduce": ("--no-async-tensor-model-parallel-allreduce", "not_flag"),
    "scatter_gather_tensors_in_pipeline": ("--scatter-gather-tensors-in-pipeline", "flag"),
    "deterministic_mode": ("--deterministic-mode", "flag"),
    "overlap_moe_expert_parallel_comm": ("--overlap-moe-expert-parallel-comm", "flag"),
    "delay_wgrad_compute": ("--delay-wgrad-compute", "flag"),
    # schedule / step features (config/specs/parallel.py; Megatron-LM d98e8a64ddf3 training/arguments.py)
    "cuda_graph_impl": ("--cuda-graph-impl", "str"),
    "cuda_graph_modules": ("--cuda-graph-modules", "list"),
    "cuda_graph_scope": ("--cuda-graph-scope", "list"),
    "enable_cuda_graph": ("--enable-cuda-graph", "flag"),
    "external_cuda_graph": ("--external-cuda-graph", "flag"),
    "cuda_graph_warmup_steps": ("--cuda-graph-warmup-steps", "int"),
    "overlap_param_gather_with_optimizer_step": ("--overlap-param-gather-with-optimizer-step", "flag"),
    "defer_embedding_wgrad_compute": ("--defer-embedding-wgrad-compute", "flag"),
    "wgrad_deferral_limit": ("--wgrad-deferral-limit", "int"),
    "num_distributed_optimizer_instances": ("--num-distributed-optimizer-instances", "int"),
    "pipeline_model_parallel_layout": ("--pipeline-model-parallel-layout", "str"),
    "microbatch_group_size_per_vp_stage": ("--microbatch-group-size-per-virtual-pipeline-stage", "int"),
    "use_tp_pp_dp_mapping": ("--use-tp-pp-dp-mapping", "flag"),
    # Megatron-FSDP (sim/data_parallel/fsdp.py)
    "use_megatron_fsdp": ("--use-megatron-fsdp", "flag"),
    "use_torch_fsdp2": ("--use-torch-fsdp2", "flag"),
    "data_parallel_sharding_strategy": ("--data-parallel-sharding-strategy", "str"),
    "outer_dp_sharding_strategy": ("--outer-dp-sharding-strategy", "str"),
    "megatron_fsdp_main_params_dtype": ("--megatron-fsdp-main-params-dtype", "str"),
    "megatron_fsdp_main_grads_dtype": ("--megatron-fsdp-main-grads-dtype", "str"),
    "megatron_fsdp_grad_comm_dtype": ("--megatron-fsdp-grad-comm-dtype", "str"),
    "fsdp_double_buffer": ("--fsdp-double-buffer", "flag"),
    "nccl_ub": ("--use-nccl-ub", "flag"),
    "suggested_communication_unit_size": ("--suggested-communication-unit-size", "int"),
    "cpu_offloading_num_layers": ("--cpu-offloading-num-layers", "int"),
    "test_mode": ("--test-mode", "flag"),
    "fine_grained_activation_offloading": ("--fine-grained-activation-offloading", "flag"),
    "offload_modules": ("--offload-modules", "list"),
    "cp_comm_type": ("--cp-comm-type", "words"),
    "hierarchical_context_parallel_sizes": ("--hierarchical-context-parallel-sizes", "ints"),
    "overlap_p2p_comm_warmup_flush": ("--overlap-p2p-communication-warmup-flush", "flag"),
    # the optimizer (config/specs/optimizer_fields.py, sim/data_parallel/optimizer_muon.py)
    "optimizer": ("--optimizer", "str"),
    "muon_num_ns_steps": ("--muon-num-ns-steps", "int"),
    "muon_tp_mode": ("--muon-tp-mode", "str"),
    "muon_split_qkv": ("--muon-no-split-qkv", "not_flag"),
    "muon_scalar_optimizer": ("--muon-scalar-optimizer", "str"),
    "use_layer_wise_param_layout": ("--no-use-layer-wise-param-layout", "not_flag"),
}
# Fields written to a launch line only when they differ from Megatron's default (their ParallelConfig
# default), and only with the setting they belong to.
DEFAULT_ONLY_WITH = {"fp8_recipe": "fp8_format", "fp4_recipe": "fp4_format", "num_layers_at_start_in_bf16": "first_last_layers_bf16",
                     "num_layers_at_end_in_bf16": "first_last_layers_bf16",
                     "main_params_dtype": "use_precision_aware_optimizer",
                     "exp_avg_dtype": "use_precision_aware_optimizer",
                     "main_grads_dtype": "use_precision_aware_optimizer",
                     "exp_avg_sq_dtype": "use_precision_aware_optimizer",
                     "cross_entropy_fusion_impl": "cross_entropy_loss_fusion",
                     "wgrad_deferral_limit": "defer_embedding_wgrad_compute",
                     **{f: "use_megatron_fsdp" for f in (
                         "data_parallel_sharding_strategy", "outer_dp_sharding_strategy",
                         "megatron_fsdp_main_params_dtype", "megatron_fsdp_main_grads_dtype",
                         "megatron_fsdp_grad_comm_dtype")}}
# Other real Megatron-LM flags echo-tune writes or reads.
EXTRA_FLAGS = ("--bf16", "--fp16", "--group-query-attention", "--virtual-pipeline-model-parallel-size")
# Flags of a launch line that set a field indirectly (Megatron-LM d98e8a64ddf3 training/arguments.py and
# training/training.py unless noted): flag -> number of values it takes.
LINE_FLAGS = {
    "--group-query-attention": 0,       # without it Megatron sets num_query_groups = num_attention_heads
    "--tokenizer-type": 1, "--tokenizer-model": 1,  # vocab size from config/launch/tokenizers.py
    "--merge-file": 1,                  # a BPE merges file: GPT2BPETokenizer, the only BPE tokenizer reading it
    "--recompute-activations": 0,       # sets recompute_granularity = selective
    "--activations-checkpoint-method": 1,      # Megatron 2021 name of --recompute-method (with full recompute)
    "--activations-checkpoint-num-layers": 1,  # Megatron 2021 name of --recompute-num-layers
    "--checkpoint-num-layers": 1,              # Megatron 2020 name of the same
    "--use-rotary-position-embeddings": 0,     # deprecated: sets position_embedding_type = rope (validate_args)
    "--step-batch-size-schedule": -1,   # the global batch steps up: its final size (config/specs/batch_schedule.py)
    "--no-scatter-gather-tensors-in-pipeline": 0,  # Megatron 2021-2023: whole-tensor pipeline sends (the default)
    "--tp-comm-overlap-cfg": 1,         # the userbuffer settings file, read into tp_comm_overlap_cfg (config/launch/ub_config.py)
}
# Accepted spellings that older Megatron versions or users write for the same field.
ALIASES = {"--virtual-pipeline-model-parallel-size": "virtual_pipeline_model_parallel_size",
           # deprecated per-backend SM counts, routed to the flex one (transformer_config.py __post_init__)
           "--moe-deepep-num-sms": "moe_flex_dispatcher_num_sms",
           "--moe-hybridep-num-sms": "moe_flex_dispatcher_num_sms"}
# Flags parse_megatron_line reads itself: the precision, and Megatron 2021's full uniform recompute.
SPECIAL_FLAGS = ("--bf16", "--fp16", "--checkpoint-activations")

MEGATRON_FLAGS = frozenset([f for f, _ in MODEL_FLAGS.values()] + [f for f, _ in PARALLEL_FLAGS.values()]
                           + list(EXTRA_FLAGS))
