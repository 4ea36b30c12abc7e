"""Every rule that ties model, cluster, GPU count and layout together lives in ``check_compatible``.

It returns a ``Layout``: the derived values (data-parallel size, micro-batches, layers per stage and
chunk, which groups cross nodes) that the rest of echo-tune reads instead of recomputing them.
"""

from __future__ import annotations

from echo_tune.config._checks import require
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.rules.expert_layout import expert_groups
# The checked spec check_compatible returns lives in config/specs/layout.py (the simulator reads it there).
from echo_tune.config.specs.layout import GroupPlacement, Layout
from echo_tune.config.rules.local_spec import check_local_layout
from echo_tune.config.specs.model import FLASH_STYLE_BACKENDS, ModelSpec
from echo_tune.config.rules.determinism_rules import check_deterministic
from echo_tune.config.rules.optimizer_rules import check_muon
from echo_tune.config.rules.cp_comm_rules import check_cp_comm, cp_groups, resolved_cp_comm
from echo_tune.config.launch.ub_config import ub_config_problem
from echo_tune.config.rules.linear_attention_rules import check_linear_attention_layout
from echo_tune.config.rules.offload_rules import check_cpu_offload, check_fine_grained_offload
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.config.rules.schedule_rules import (check_schedule_features, cuda_graph_setting, userbuffer_notes,
                                             userbuffer_overlap)
from echo_tune.config.rules.stage_split import check_group_size, split_stages

# Megatron-LM's rank order, innermost first (megatron/core/parallel_state.py, order "tp-cp-ep-dp-pp").
RANK_ORDER = ("tp", "cp", "dp", "pp")
# --use-tp-pp-dp-mapping: order "tp-cp-ep-pp-dp" (training/initialize.py): a pipeline's stages are neighbours
# in rank order, the data-parallel replicas are strided by TP x CP x PP.
TP_PP_DP_ORDER = ("tp", "cp", "pp", "dp")


MAX_TOKENS_PER_STEP = 2**31
"""A global batch above this many tokens is a unit slip (a batch given in tokens): 128x Llama 3 405B's 16M-token
batch (arXiv 2407.21783, section 3.4.1), the largest published."""


def _group_placements(parallel: ParallelConfig, cluster: ClusterSpec, dp: int) -> dict[str, GroupPlacement]:
    """Placement by NVLink domain: on a GB200 NVL72 rack 72 GPUs (18 trays) talk over NVLink, so a
    "node" here is the NVLink domain (``ClusterSpec.nvlink_domain_gpus``), not the compute tray."""
    domain = cluster.nvlink_domain_gpus
    sizes = {"tp": parallel.tensor_model_parallel_size, "cp": parallel.context_parallel_size,
             "dp": dp, "pp": parallel.pipeline_model_parallel_size}
    placements, stride = {}, 1
    for kind in (TP_PP_DP_ORDER if parallel.use_tp_pp_dp_mapping else RANK_ORDER):
        size = sizes[kind]
        per_node = max(1, min(size, domain // stride)) if stride < domain else 1
        span_nodes = (stride * (size - 1)) // cluster.gpus_per_node + 1  # physical nodes from first to last rank
        placements[kind] = GroupPlacement(size=size, ranks_per_node=per_node, num_nodes=-(-size // per_node),
                                          num_leaves=cluster.leaves_spanned(span_nodes),
                                          spine_oversubscription=cluster.spine_oversubscription)
        stride *= size
    return placements


def _check_fp8(model: ModelSpec, cluster: ClusterSpec, parallel: ParallelConfig) -> None:
    """FP8 rules of Megatron-LM d98e8a64ddf3 (training/arguments.py, core/transformer/transformer_config.py)."""
    if parallel.fp4_format is not None:
        require(parallel.precision == "bf16", f"`--fp4-format` is modelled beside --bf16 parameters only, but got "
                                              f"(precision={parallel.precision!r}); add --bf16")
        cluster.gpu.peak_tflops("fp4")  # refuses a GPU without FP4 tensor cores, by name
    fp8_only = [n for n in ("fp8_param_gather", "first_last_layers_bf16") if getattr(parallel, n)]
    if not parallel.fp8:
        require(not fp8_only, f"{fp8_only} need `fp8_format`, but got (fp8_format=None); add --fp8-format hybrid")
        return
    # FP8 GEMMs beside fp32 or fp16 parameters (Megatron allows both): activations, quantisation reads, GEMM outputs
    # and saved inputs in the training precision (cost/kernels/fp8.py ACTIVATION_BYTES); an FP8 weight's fp32 main copy in
    # fp32 training (sim/memory/stage.py fp8_main_copy_bytes_per_param)
    cluster.gpu.peak_tflops("fp8")  # refuses a GPU without FP8 tensor cores, by name
    require(parallel.fp8_recipe != "mxfp8" or cluster.gpu.peak_fp4_tflops is not None,
            f"`fp8_recipe == 'mxfp8'` needs Blackwell MX tensor cores, but got (gpu={cluster.gpu.name!r}); "
            f"use --fp8-recipe delayed, tensorwise or blockwise")
    require(not parallel.fp8_param_gather or parallel.use_distributed_optimizer,
            "`fp8_param_gather` needs `use_distributed_optimizer`, but got (fp8_param_gather=True, "
            "use_distributed_optimizer=False); add --use-distributed-optimizer")
    # distributed_data_parallel_config.py __post_init__ asserts fp8_param_gather; its docstring: "Should be set to
    # True only when fp8_recipe is mxfp8 and fp8_param_gather is True" (the shared grad/param buffer is made for
    # MXFP8 parameters only, param_and_grad_buffer.py)
    require(not parallel.reuse_grad_buf_for_mxfp8_param_ag
            or (parallel.fp8_recipe == "mxfp8" and parallel.fp8_param_gather),
            f"`reuse_grad_buf_for_mxfp8_param_ag` needs `fp8_recipe == 'mxfp8'` and `fp8_param_gather`, but got "
            f"(fp8_recipe={parallel.fp8_recipe!r}, fp8_param_gather={parallel.fp8_param_gather}); add "
            f"--fp8-recipe mxfp8 --fp8-param-gather or drop --reuse-grad-buf-for-mxfp8-param-ag")
    if parallel.first_last_layers_bf16:
        require(parallel.fp8_recipe != "delayed",
                "`first_last_layers_bf16` is not supported with `fp8_recipe == 'delayed'`, but got "
                "(first_last_layers_bf16=True, fp8_recipe='delayed'); use --fp8-recipe tensorwise or blockwise")
        per_stage = model.num_layers // parallel.pipeline_model_parallel_size
        for name in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            value = getattr(parallel, name)
            require(value <= per_stage, f"`{name} <= num_layers / pipeline_model_parallel_size` must hold, but "
                                        f"got ({name}={value}, layers per stage={per_stage})")


def check_compatible(model: ModelSpec, cluster: ClusterSpec, num_gpus: int,
                     parallel: ParallelConfig) -> Layout:
    """Check every cross-object rule; return the derived ``Layout`` or raise ``ConfigError``."""
    tp, pp, cp = (parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size,
                  parallel.context_parallel_size)
    require(isinstance(num_gpus, int) and num_gpus > 0, f"`num_gpus > 0` must hold, but got (num_gpus={num_gpus!r})")
    require(num_gpus <= cluster.gpus_per_node or num_gpus % cluster.gpus_per_node == 0,
            f"`num_gpus % gpus_per_node == 0` must hold for multi-node runs, but got (num_gpus={num_gpus}, "
            f"gpus_per_node={cluster.gpus_per_node}); use whole nodes")
    model_parallel = tp * pp * cp
    require(num_gpus % model_parallel == 0,
            f"`num_gpus % (tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size) == 0` "
            f"must hold (world size = TP*PP*CP*DP), but got (num_gpus={num_gpus}, tensor_model_parallel_size={tp}, "
            f"pipeline_model_parallel_size={pp}, context_parallel_size={cp})")
    dp = num_gpus // model_parallel
    require(model.num_attention_heads % tp == 0,
            f"`num_attention_heads % tensor_model_parallel_size == 0` must hold, but got "
            f"(num_attention_heads={model.num_attention_heads}, tensor_model_parallel_size={tp}); use a TP size "
            f"that divides {model.num_attention_heads}")
    if model.query_groups % tp and tp % model.query_groups == 0:  # Megatron-Core allows it; echo-tune does not
        raise UnmodelledError(f"tensor_model_parallel_size above num_query_groups (Megatron replicates each key/value "
                              f"head over TP / num_query_groups ranks) is not modelled, but got (num_query_groups="
                              f"{model.query_groups}, tensor_model_parallel_size={tp}); use a TP size that divides "
                              f"{model.query_groups}")
    require(model.query_groups % tp == 0,  # transformer_config.py __post_init__: a multiple or a divisor of TP
            f"`num_query_groups` must be a multiple or a divisor of `tensor_model_parallel_size`, but got "
            f"(num_query_groups={model.query_groups}, tensor_model_parallel_size={tp}); use a TP size that "
            f"divides {model.query_groups}")
    require(model.ffn_size % tp == 0,
            f"`ffn_hidden_size % tensor_model_parallel_size == 0` must hold, but got "
            f"(ffn_hidden_size={model.ffn_size}, tensor_model_parallel_size={tp})")
    sequence_parallel = parallel.sequence_parallel and tp > 1  # Megatron turns SP off at TP=1
    if sequence_parallel:
        require(model.seq_length % (tp * cp) == 0,
                f"`seq_length % (tensor_model_parallel_size * context_parallel_size) == 0` must hold with "
                f"sequence_parallel, but got (seq_length={model.seq_length}, tensor_model_parallel_size={tp}, "
                f"context_parallel_size={cp})")
    if cp > 1:
        require(model.seq_length % (2 * cp) == 0,
                f"`seq_length % (2 * context_parallel_size) == 0` must hold (Megatron splits the sequence into "
                f"2*CP chunks), but got (seq_length={model.seq_length}, context_parallel_size={cp})")
        # TransformerEngine (dot_product_attention/utils.py get_attention_backend) disables its unfused attention
        # under context parallelism, and Megatron's local DotProductAttention asserts CP 1: only the flash-style
        # backends run it
        require(model.flash_attention or model.local_spec,  # the local spec: check_local_layout's own rule
                f"`context_parallel_size > 1` needs a flash-style attention backend (TransformerEngine's flash or "
                f"fused attention; its unfused one and Megatron's local one refuse context parallelism), but got "
                f"(context_parallel_size={cp}, attention_backend={_backend_name(model)}); set --attention-backend "
                f"flash (or auto / fused), or --context-parallel-size 1")
    tokens = parallel.global_batch_size * model.seq_length
    require(tokens <= MAX_TOKENS_PER_STEP,
            f"`global_batch_size * seq_length <= {MAX_TOKENS_PER_STEP:,}` tokens per step must hold (128x the largest "
            f"published pre-training batch, Llama 3's 16M tokens), but got (global_batch_size="
            f"{parallel.global_batch_size:,}, seq_length={model.seq_length:,}): --global-batch-size counts sequences, "
            f"not tokens; a batch of {parallel.global_batch_size:,} tokens is "
            f"{max(1, parallel.global_batch_size // model.seq_length):,} sequences")
    per_step = parallel.micro_batch_size * dp
    require(parallel.global_batch_size % per_step == 0,
            f"`global_batch_size % (micro_batch_size * data_parallel_size) == 0` must hold, but got "
            f"(global_batch_size={parallel.global_batch_size}, micro_batch_size={parallel.micro_batch_size}, "
            f"data_parallel_size={dp}); change the batch sizes or the GPU split")
    num_micro_batches = parallel.global_batch_size // per_step

    contents = split_stages(model, parallel)
    vpp = len(contents[0])
    chunks = tuple(tuple(c.layers for c in row) for row in contents)
    if vpp > 1:
        group = parallel.microbatch_group_size_per_vp_stage
        if group is None:
            require(num_micro_batches % pp == 0,
                    f"the interleaved schedule needs `num_micro_batches % pipeline_model_parallel_size == 0`, but "
                    f"got (num_micro_batches={num_micro_batches}, pipeline_model_parallel_size={pp}); change "
                    f"global_batch_size or micro_batch_size")
        else:
            check_group_size(group, pp, num_micro_batches)
    else:
        require(not parallel.overlap_p2p_comm_warmup_flush,
                f"--overlap-p2p-communication-warmup-flush needs the interleaved schedule (Megatron turns "
                f"overlap_p2p_comm off without it), but got (virtual pipeline size={vpp}); drop it or set "
                f"virtual_pipeline_model_parallel_size")
        require(parallel.microbatch_group_size_per_vp_stage is None,
                f"microbatch_group_size_per_vp_stage applies to the interleaved schedule only, but got "
                f"(microbatch_group_size_per_vp_stage={parallel.microbatch_group_size_per_vp_stage}, "
                f"virtual pipeline size={vpp}); drop it or set virtual_pipeline_model_parallel_size")
    max_chunk_layers = max(max(row) for row in chunks)

    granularity, method, recompute_layers = (parallel.recompute_granularity, parallel.recompute_method,
                                             parallel.recompute_num_layers)
    require(parallel.recompute_modules is None or granularity == "selective",
            f"recompute_modules applies only to `recompute_granularity == 'selective'`, but got "
            f"(recompute_granularity={granularity!r}, recompute_modules={list(parallel.recompute_modules or [])})")
    if granularity != "full":
        require(method is None and recompute_layers is None,
                f"recompute_method and recompute_num_layers apply only to `recompute_granularity == 'full'`, but "
                f"got (recompute_granularity={granularity!r}, recompute_method={method!r}, "
                f"recompute_num_layers={recompute_layers})")
    else:
        # Megatron 2021's --checkpoint-activations behaviour: uniform, one layer per checkpoint.
        method = method or "uniform"
        recompute_layers = recompute_layers or 1
        if method == "block":
            require(recompute_layers <= max_chunk_layers,
                    f"`recompute_num_layers <= layers per model chunk` must hold for block recompute, but got "
                    f"(recompute_num_layers={recompute_layers}, layers per model chunk={max_chunk_layers})")
    require(not parallel.overlap_param_gather or parallel.use_distributed_optimizer,
            "`overlap_param_gather` needs `use_distributed_optimizer`, but got (overlap_param_gather=True, "
            "use_distributed_optimizer=False); add --use-distributed-optimizer")
    # at TP=1 there is no TP communication to overlap: like sequence_parallel, the flag is a no-op
    require(not parallel.tp_comm_overlap or tp == 1 or sequence_parallel,
            f"`tp_comm_overlap` needs sequence_parallel when tensor_model_parallel_size > 1, but got "
            f"(tp_comm_overlap=True, sequence_parallel={parallel.sequence_parallel}, tensor_model_parallel_size={tp}); "
            f"add --sequence-parallel")
    _check_fp8(model, cluster, parallel)
    check_local_layout(model, parallel, sequence_parallel)
    check_schedule_features(model, parallel, dp, vpp)
    check_cpu_offload(model, parallel)
    check_fine_grained_offload(model, parallel)
    precision_aware = (parallel.main_params_dtype, parallel.exp_avg_dtype, parallel.exp_avg_sq_dtype,
                       parallel.main_grads_dtype) != ("fp32",) * 4
    require(not precision_aware or parallel.use_precision_aware_optimizer,
            "main_params_dtype / exp_avg_dtype / exp_avg_sq_dtype / main_grads_dtype apply with `use_precision_aware_optimizer`, but got "
            "(use_precision_aware_optimizer=False); add --use-precision-aware-optimizer")
    require(not parallel.use_precision_aware_optimizer or parallel.use_distributed_optimizer,
            "`use_precision_aware_optimizer` needs `use_distributed_optimizer`, but got "
            "(use_distributed_optimizer=False); add --use-distributed-optimizer")
    modules = parallel.recompute_modules or () if parallel.recompute_granularity == "selective" else ()
    # Megatron-LM d98e8a64ddf3 transformer_config.py __post_init__ (recompute_modules checks)
    require("moe_act" not in modules or model.moe_grouped_gemm,
            "`recompute_modules` moe_act needs `moe_grouped_gemm` (Megatron-Core), but got (moe_grouped_gemm=False); "
            "add --moe-grouped-gemm")
    require("moe_act" not in modules or not parallel.fp8 or parallel.fp8_recipe != "delayed",
            "`recompute_modules` moe_act does not work with the delayed FP8 recipe (Megatron-Core), but got "
            "(fp8_recipe='delayed'); use --fp8-recipe tensorwise or drop moe_act")
    require("shared_experts" not in modules or not model.moe_shared_expert_overlap,
            "`recompute_modules` shared_experts cannot run with `moe_shared_expert_overlap` (Megatron-Core), but "
            "got (moe_shared_expert_overlap=True); drop one")
    num_sms = model.moe_flex_dispatcher_num_sms if model.is_moe else None
    require(num_sms is None or cluster.gpu.sm_count is None or num_sms < cluster.gpu.sm_count,
            f"`moe_flex_dispatcher_num_sms < SMs of the GPU` must hold (compute needs SMs beside the dispatch "
            f"kernels), but got (moe_flex_dispatcher_num_sms={num_sms}, sm_count={cluster.gpu.sm_count}); lower "
            f"--moe-flex-dispatcher-num-sms")
    require(not parallel.grad_reduce_in_bf16 or parallel.precision == "bf16",
            f"`grad_reduce_in_bf16` needs bf16 training, but got (precision={parallel.precision!r})")
    schedule = "none" if pp == 1 else ("interleaved" if vpp > 1 else "1f1b")
    check_cp_comm(model, parallel)
    check_deterministic(model, parallel)
    check_muon(model, parallel)
    ub_config_problem(parallel)
    check_linear_attention_layout(model, parallel)
    groups = _group_placements(parallel, cluster, dp) | cp_groups(parallel, cluster.nvlink_domain_gpus, GroupPlacement) \
        | expert_groups(model, parallel, dp, cluster.nvlink_domain_gpus,
                                                                      GroupPlacement)
    return Layout(num_gpus=num_gpus, data_parallel_size=dp, num_micro_batches=num_micro_batches,
                  virtual_pipeline_size=vpp, stage_chunk_layers=chunks, chunk_contents=contents, schedule=schedule,
                  sequence_parallel=sequence_parallel, recompute_granularity=granularity,
                  recompute_method=method, recompute_num_layers=recompute_layers,
                  recompute_regions=parallel.recompute_regions,
                  recompute_discarding_regions=parallel.recompute_discarding_regions,
                  groups=groups, p2p_scatter_gather=(parallel.scatter_gather_tensors_in_pipeline and pp > 1
                                                     and tp > 1 and not sequence_parallel),
                  cuda_graphs=cuda_graph_setting(parallel), tp_comm_overlap=userbuffer_overlap(model, parallel),
                  notes=userbuffer_notes(model, parallel), cp_comm=resolved_cp_comm(parallel))


def _backend_name(model: ModelSpec) -> str:
    """The attention backend as the user set it (the legacy --use-flash-attn spelling, the local spec)."""
    if model.use_flash_attn is not None:
        return "flash" if model.use_flash_attn else "unfused (--use-flash-attn off)"
    if model.flash_attention or model.attention_backend not in FLASH_STYLE_BACKENDS:
        return model.attention_backend
    return f"{model.attention_backend}, which runs unfused here (attention sinks with a window and dropout)"
