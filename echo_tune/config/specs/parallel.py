"""The parallel layout and training settings: one field per Megatron-LM argument.

Only user choices are fields. Derived values (data-parallel size, micro-batch count, layers per
stage) are computed by ``Layout`` in ``compatibility.py`` once the world size is known.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from echo_tune.config._checks import require, require_choice, require_positive
from echo_tune.config.specs.cluster import PRECISIONS
from echo_tune.config.specs.optimizer_fields import OptimizerFields
from echo_tune.config.specs.pipeline_layout import normalize_layout, parse_layout

RECOMPUTE_GRANULARITIES = (None, "full", "selective")
RECOMPUTE_METHODS = (None, "uniform", "block")
# Megatron-LM d98e8a64ddf3 megatron/core/transformer/transformer_config.py (fp8, fp8_recipe).
FP8_FORMATS = (None, "e4m3", "hybrid")
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
FP4_FORMATS = (None, "e2m1")
FP4_RECIPES = ("nvfp4",)  # Megatron also takes "custom" (a user's quantizer factory): not modelled
# Optimizer-state dtypes of --exp-avg-dtype / --exp-avg-sq-dtype / --main-params-dtype and their bytes.
STATE_DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}
# Megatron-Core's selective-recompute modules (transformer_config.py ``recompute_modules``) -> the traced
# regions they replay (workload/layers.py, mla.py, moe.py), "region/subregion" for a tagged part of a region:
# moe_act = the experts' activation of fc1's output (moe/experts.py ``bias_act_func``), shared_experts = the
# shared expert MLP (moe/moe_layer.py ``shared_experts_recompute``), Megatron-LM d98e8a64ddf3.
RECOMPUTE_MODULE_REGIONS = {"core_attn": ("core_attention",), "layernorm": ("input_norm", "mlp_norm"),
                            "mla_up_proj": ("mla_up_proj",), "mlp": ("mlp",), "moe": ("moe",)}
RECOMPUTE_MODULE_REGIONS.update({"moe_act": ("moe/expert_act",), "shared_experts": ("moe/shared",)})
# Megatron-LM d98e8a64ddf3 core/transformer/transformer_config.py ``cuda_graph_impl``.
CUDA_GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
# modules Megatron-Core checkpoints "output-discarding" (their outputs are freed too), the others keep outputs
# (transformer_config.py ``recompute_modules`` docstring, d98e8a64ddf3: moe_act uses CheckpointWithoutOutput)
OUTPUT_DISCARDING_MODULES = ("layernorm", "mla_up_proj", "moe_act")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig(OptimizerFields):
    """A Megatron-LM parallel layout and the training settings that shape one step."""

    tensor_model_parallel_size: int = 1
    """``--tensor-model-parallel-size``: TP degree (innermost ranks, inside a node)."""

    pipeline_model_parallel_size: int = 1
    """``--pipeline-model-parallel-size``: number of pipeline stages."""

    context_parallel_size: int = 1
    """``--context-parallel-size``: CP degree (sequence split for attention)."""

    expert_model_parallel_size: int = 1
    """``--expert-model-parallel-size``: EP degree, experts split over ranks carved from TP x CP x DP."""

    expert_tensor_parallel_size: int | None = None
    """``--expert-tensor-parallel-size``: ETP degree of each expert's GEMMs; None means TP (Megatron's default)."""

    virtual_pipeline_model_parallel_size: int | None = None
    """``--virtual-pipeline-model-parallel-size``: model chunks per stage (interleaved 1F1B); None or 1 = off."""

    num_layers_per_virtual_pipeline_stage: int | None = None
    """``--num-layers-per-virtual-pipeline-stage``: the other way to ask for interleaving."""

    decoder_first_pipeline_num_layers: int | None = None
    """``--decoder-first-pipeline-num-layers``: layers on the first stage when stages are uneven."""

    decoder_last_pipeline_num_layers: int | None = None
    """``--decoder-last-pipeline-num-layers``: layers on the last stage when stages are uneven."""

    account_for_embedding_in_pipeline_split: bool = False
    """``--account-for-embedding-in-pipeline-split``: the embedding counts as a layer of the pipeline split
    (the first model chunk builds one transformer layer fewer)."""

    account_for_loss_in_pipeline_split: bool = False
    """``--account-for-loss-in-pipeline-split``: the output layer and loss count as a layer of the split
    (the last model chunk builds one transformer layer fewer)."""

    micro_batch_size: int = 1
    """``--micro-batch-size``: samples per micro-batch per data-parallel rank."""

    global_batch_size: int
    """``--global-batch-size``: samples per optimizer step, over all data-parallel ranks."""

    recompute_granularity: str | None = None
    """``--recompute-granularity``: None, full or selective."""

    recompute_method: str | None = None
    """``--recompute-method``: uniform or block (with full recompute)."""

    recompute_modules: tuple[str, ...] | None = None
    """``--recompute-modules``: with selective recompute, the modules recomputed in backward; None means
    Megatron's default ``core_attn``. Modelled: core_attn, layernorm, mla_up_proj, mlp, moe, moe_act,
    shared_experts."""

    recompute_num_layers: int | None = None
    """``--recompute-num-layers``: layers per recompute unit (uniform) or recomputed layers per stage (block)."""

    sequence_parallel: bool = False
    """``--sequence-parallel``: shard norms/dropout over TP; all-gather + reduce-scatter instead of all-reduce."""

    use_distributed_optimizer: bool = False
    """``--use-distributed-optimizer``: shard optimizer states over DP (ZeRO-1)."""

    overlap_grad_reduce: bool = False
    """``--overlap-grad-reduce``: reduce gradient buckets during the backward pass."""

    overlap_param_gather: bool = False
    """``--overlap-param-gather``: all-gather parameters during the next forward pass (distributed optimizer)."""

    tp_comm_overlap: bool = False
    """``--tp-comm-overlap``: overlap TP/SP collectives with the GEMMs that use them."""

    precision: str = "bf16"
    """``--bf16`` / ``--fp16`` (or fp32 when neither is given): the parameter and activation dtype."""

    grad_reduce_in_bf16: bool = False
    """``--grad-reduce-in-bf16``: keep and reduce the gradient buffer in bf16 instead of fp32
    (Megatron otherwise sets accumulate_allreduce_grads_in_fp32 for bf16, training/arguments.py)."""

    use_precision_aware_optimizer: bool = False
    """``--use-precision-aware-optimizer``: optimizer states in the dtypes below (distributed optimizer)."""

    main_params_dtype: str = "fp32"
    """``--main-params-dtype``: fp32 or fp16 master parameters (with the precision-aware optimizer)."""

    exp_avg_dtype: str = "fp32"
    """``--exp-avg-dtype``: fp32, fp16, bf16 or fp8 Adam first moment (with the precision-aware optimizer)."""

    exp_avg_sq_dtype: str = "fp32"
    """``--exp-avg-sq-dtype``: fp32, fp16, bf16 or fp8 Adam second moment (with the precision-aware optimizer)."""

    main_grads_dtype: str = "fp32"
    """``--main-grads-dtype``: fp32 or bf16 gradients for the precision-aware optimizer. Megatron-LM d98e8a64ddf3
    training/arguments.py: with bf16 main grads it no longer forces ``accumulate_allreduce_grads_in_fp32``, so
    DDP's grad buffer (accumulation, reduce-scatter) is bf16, and the optimizer reads its shard of that buffer in
    place (``decoupled_grad``, core/optimizer/distrib_optimizer.py): no other buffer (``grad_bytes_per_param``)."""

    fp8_format: str | None = None
    """``--fp8-format``: e4m3 or hybrid (e4m3 forward, e5m2 gradients) runs the transformer layers'
    linear GEMMs in FP8 through Transformer Engine; None = off. ``precision`` stays bf16, as Megatron
    is launched with ``--bf16 --fp8-format ...``."""

    fp8_recipe: str = "delayed"
    """``--fp8-recipe``: delayed (amax history), tensorwise (current per-tensor scaling), blockwise
    (1x128 / 128x128 blocks) or mxfp8 (32-element blocks, Blackwell only). Megatron's default: delayed."""

    fp8_param_gather: bool = False
    """``--fp8-param-gather``: keep the linear weights in FP8 and all-gather them in FP8 (distributed
    optimizer)."""

    fp4_format: str | None = None
    """``--fp4-format``: e2m1 runs the transformer layers' linear GEMMs in NVFP4 through Transformer Engine
    (``fp4_recipe``); None = off. Excludes ``fp8_format`` (training/arguments.py); ``precision`` stays bf16."""

    fp4_recipe: str = "nvfp4"
    """``--fp4-recipe``: nvfp4, TE's NVFP4BlockScaling (core/fp4_utils.py): 16-element blocks with E4M3 scales and a
    per-tensor scale, 16x16 blocks for weights, random Hadamard transforms on the wgrad GEMMs' inputs, stochastic
    rounding of gradients (cost/kernels/fp8.py)."""

    reuse_grad_buf_for_mxfp8_param_ag: bool = False
    """``--reuse-grad-buf-for-mxfp8-param-ag``: MXFP8 parameters are all-gathered in bf16 into the (idle) gradient
    buffer and re-quantised into their MXFP8 storage afterwards (param_and_grad_buffer.py ``_post_param_sync``),
    instead of keeping a separate parameter buffer (sim/data_parallel/dp.py)."""

    first_last_layers_bf16: bool = False
    """``--first-last-layers-bf16``: run the first and last transformer layers in bf16 (not with the
    delayed recipe)."""

    num_layers_at_start_in_bf16: int = 1
    """``--num-layers-at-start-in-bf16``: layers kept in bf16 at the start (with first_last_layers_bf16)."""

    num_layers_at_end_in_bf16: int = 1
    """``--num-layers-at-end-in-bf16``: layers kept in bf16 at the end (with first_last_layers_bf16)."""

    gradient_accumulation_fusion: bool = True
    """False is ``--no-gradient-accumulation-fusion``: each weight-gradient GEMM writes a temporary
    gradient that is then added into main_grad, once per micro-batch (sim/schedule/grad_accumulation.py)."""

    async_tensor_model_parallel_allreduce: bool = True
    """False is ``--no-async-tensor-model-parallel-allreduce`` (a Megatron-LM flag from 3f65246911, 2021-09-02, to
    639c08ab82, 2026-01-29, ignored since 5fffdfc737, 2024-04-29, and never read by TE's linears): a
    column-parallel layer's dgrad all-reduce (no sequence parallelism) waits until both its GEMMs are done, fully
    exposed. True (Megatron since 2021-09): it runs beside the wgrad GEMM (``cost/tp_overlap.async_pairs``). The
    sequence-parallel all-gather and reduce-scatter run beside their GEMMs either way (asynchronous since
    sequence parallelism came, 02bb1f5c86). Code before cf7efd4f5a ran as False, e.g. the runs of Narayanan et
    al. 2021 (the errata of runs_megatron.csv)."""

    scatter_gather_tensors_in_pipeline: bool = False
    """``--scatter-gather-tensors-in-pipeline`` (Megatron-LM 2021-2023 code): without sequence parallelism at TP > 1,
    a pipeline send carries 1/TP of the activation and the receiver all-gathers it over its TP group (Narayanan et
    al. 2021, sec. 4.1; megatron/p2p_communication.py from 27fc468964, 2021-01-20, on by default from 72e4230bb5,
    2021-02-16). Megatron-Core's p2p (39b83c7953, 2023-01-31, to d98e8a64ddf3) sends the whole tensor, and the
    flag was ignored until its removal (10e7b74597, 2026-04-03): False, today's Megatron, is the default."""

    deterministic_mode: bool = False
    """``--deterministic-mode``: NCCL_ALGO=Ring, deterministic TE attention backward, deterministic
    cuBLAS workspace (megatron/training/determinism.py; sim/features/determinism.py)."""

    overlap_moe_expert_parallel_comm: bool = False
    """``--overlap-moe-expert-parallel-comm``: Megatron-Core's EP all-to-all overlap: the forward of one
    micro-batch and the backward of another run as one combined 1F1B step, each MoE dispatch / combine hidden
    behind the other micro-batch's compute (megatron/core/pipeline_parallel/combined_1f1b.py;
    ``sim/features/moe_overlap.py``)."""

    delay_wgrad_compute: bool = False
    """``--delay-wgrad-compute``: split the weight-gradient GEMMs from backward so that they fill the gaps of
    the EP overlap (needs overlap_moe_expert_parallel_comm)."""

    # Schedule / step features (Megatron-LM d98e8a64ddf3; mechanics in sim/features/cuda_graphs.py, sim/data_parallel/dp.py,
    # sim/features/deferred_wgrad.py; rules in config/rules/schedule_rules.py).
    cuda_graph_impl: str = "none"
    """``--cuda-graph-impl``: none, local (Megatron-Core's CudaGraphManager, per layer), transformer_engine
    (TE make_graphed_callables, per layer) or full_iteration (one graph for the forward-backward of a step,
    optimizer excluded); core/transformer/transformer_config.py ``cuda_graph_impl``."""

    cuda_graph_modules: tuple[str, ...] | None = None
    """``--cuda-graph-modules``: what the per-layer graphs capture (attn, mlp, moe, moe_router,
    moe_preprocess, mamba); None or empty = the whole transformer layer."""

    cuda_graph_scope: tuple[str, ...] | None = None
    """``--cuda-graph-scope``: the deprecated spelling of ``--cuda-graph-modules`` (Megatron migrates it, and
    its value ``full_iteration`` to ``--cuda-graph-impl full_iteration``, training/arguments.py)."""

    enable_cuda_graph: bool = False
    """``--enable-cuda-graph``: the deprecated spelling of ``--cuda-graph-impl local``."""

    external_cuda_graph: bool = False
    """``--external-cuda-graph``: the deprecated spelling of ``--cuda-graph-impl transformer_engine``."""

    cuda_graph_warmup_steps: int = 3
    """``--cuda-graph-warmup-steps``: eager steps before capture (not a steady-state step's cost)."""

    overlap_param_gather_with_optimizer_step: bool = False
    """``--overlap-param-gather-with-optimizer-step``: all-gather the first model chunk's parameters while the
    optimizer steps the other chunks (distributed optimizer, interleaved schedule)."""

    defer_embedding_wgrad_compute: bool = False
    """``--defer-embedding-wgrad-compute``: the last stage defers the output layer's weight-gradient GEMMs to
    the pipeline flush."""

    wgrad_deferral_limit: int = 0
    """``--wgrad-deferral-limit``: micro-batches whose output-layer wgrad is deferred; 0 = all of them."""

    num_distributed_optimizer_instances: int = 1
    """``--num-distributed-optimizer-instances``: shard the distributed optimizer over DP x CP / N ranks (N
    instances), all-reducing each gradient shard across the instances."""

    pipeline_model_parallel_layout: str | None = None
    """``--pipeline-model-parallel-layout``: what each pipeline chunk holds, in Megatron's layout language
    (``E`` embedding, ``t`` decoder layer, ``m`` MTP layer, ``L`` loss, ``|`` between virtual stages listed
    chunk by chunk, ``(...)*N`` and ``t*N`` repeats; ``/`` is read as ``|``). Sets VPP; see
    config/specs/pipeline_layout.py."""

    microbatch_group_size_per_vp_stage: int | None = None
    """``--microbatch-group-size-per-virtual-pipeline-stage``: micro-batches the interleaved schedule runs
    through one chunk before the next; None means PP (Megatron's default, model_parallel_config.py)."""

    use_tp_pp_dp_mapping: bool = False
    """``--use-tp-pp-dp-mapping``: rank order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp (training/initialize.py):
    pipeline stages sit inside the data-parallel stride."""

    cpu_offloading_num_layers: int = 0
    """``--cpu-offloading-num-layers``: the first N layers' activations are copied to host memory during the
    forward and back before their backward (Transformer Engine's offload context; sim/features/cpu_offload.py)."""

    cp_comm_type: str = "p2p"
    """``--cp-comm-type``: how context parallelism communicates in attention: p2p (ring), all_gather, a2a (Ulysses) or
    a2a+p2p (config/rules/cp_comm_rules.py, workload/attention/cp_attention.py); one value per layer, repeated, reads as one."""

    hierarchical_context_parallel_sizes: tuple[int, ...] | None = None
    """``--hierarchical-context-parallel-sizes``: the CP levels of a2a+p2p (all-to-all inside the first, ring over
    the second)."""

    fine_grained_activation_offloading: bool = False
    """``--fine-grained-activation-offloading``: what the ``offload_modules`` save for backward goes to host memory
    during the forward and comes back before their backward (sim/features/activation_offload.py)."""

    offload_modules: tuple[str, ...] | None = None
    """``--offload-modules``: attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act."""

    tp_comm_overlap_cfg: tuple | None = None
    """``--tp-comm-overlap-cfg FILE``: the file's userbuffer settings per TE GEMM, read when the launch line is
    (config/launch/ub_config.py ``read_ub_config``); None: TE's defaults."""

    test_mode: bool = False
    """``--test-mode``: Megatron's real-time consistency checks of the QK layernorms in every self-attention forward
    (all-gathers over DP and TP, compared on the host; sim/features/realtime_tests.py)."""

    # Megatron-FSDP (sim/data_parallel/fsdp.py; Megatron-LM d98e8a64ddf3 training/arguments.py, core/distributed/fsdp/)
    use_megatron_fsdp: bool = False
    """``--use-megatron-fsdp``: Megatron-FSDP shards parameters, gradients and optimizer states over DP x CP as
    ``data_parallel_sharding_strategy`` says (v1 turns on the distributed optimizer, arguments.py)."""

    use_torch_fsdp2: bool = False
    """``--use-torch-fsdp2``: PyTorch's FSDP2 ``fully_shard`` on every transformer layer and the root over DP x CP
    (core/distributed/torch_fully_sharded_data_parallel.py, resharded after forward): the per-layer all-gathers and
    reduce-scatters of Megatron-FSDP's optim_grads_params, as which it is simulated (config/rules/fsdp_rules.py)."""

    data_parallel_sharding_strategy: str = "optim_grads_params"
    """``--data-parallel-sharding-strategy``: no_shard | optim | optim_grads | optim_grads_params (ZeRO-0..3)."""

    outer_dp_sharding_strategy: str = "no_shard"
    """``--outer-dp-sharding-strategy``: HSDP (``--num-distributed-optimizer-instances`` > 1) outer group: no_shard
    (replicas, gradient shards all-reduced across them) or optim (optimizer states sharded across them too)."""

    megatron_fsdp_main_params_dtype: str = "fp32"
    """``--megatron-fsdp-main-params-dtype``: fp32 | bf16 | fp16 | auto (auto: no main copy, the model weights)."""

    megatron_fsdp_main_grads_dtype: str = "auto"
    """``--megatron-fsdp-main-grads-dtype``: fp32 | bf16 | fp16 | auto (auto: the model's parameter dtype)."""

    megatron_fsdp_grad_comm_dtype: str = "auto"
    """``--megatron-fsdp-grad-comm-dtype``: fp32 | bf16 | fp16 | auto (auto: the main-grads dtype)."""

    fsdp_double_buffer: bool = False
    """``--fsdp-double-buffer``: two fixed communication buffers reused by every FSDP unit (Megatron-FSDP)."""

    nccl_ub: bool = False
    """``--use-nccl-ub``: NCCL user-buffer registration of the FSDP buffers (turns on ``fsdp_double_buffer``)."""

    suggested_communication_unit_size: int | None = None
    """``--suggested-communication-unit-size``: Megatron-FSDP's pipelines in parameter elements: the all-gather
    prefetches up to half of it ahead, the reduce-scatter queue holds up to it (megatron_fsdp.py; None: at least
    1e9). echo-tune keeps one unit in flight each way (sim/data_parallel/fsdp.py), what the pipelines do when a unit holds at
    least half the size; smaller units prefetch deeper, which the report says."""

    overlap_p2p_comm_warmup_flush: bool = False
    """``--overlap-p2p-communication-warmup-flush``: overlap the interleaved schedule's pipeline sends and
    receives with compute in the warm-up and flush phases too, not only in steady 1F1B (Megatron-LM d98e8a64ddf3
    core/pipeline_parallel/schedules.py ``forward_backward_pipelining_with_interleaving``: the receive for
    micro-batch k+1 is posted before computing k). echo-tune's pipeline engine (sim/schedule/engine.py) overlaps every
    send / receive in all phases, so this setting is what it models; Megatron's default (blocking
    send-and-receive in warm-up and flush) is not modelled. Needs the interleaved schedule
    (model_parallel_config.py: only with overlap_p2p_comm, which Megatron turns off without it)."""

    def __post_init__(self) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                     "micro_batch_size", "global_batch_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool),
                    f"`{name}` must be an integer, but got ({name}={value!r})")
            require_positive(name, value)
        for name in ("expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
                     "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                     "recompute_num_layers", "microbatch_group_size_per_vp_stage"):
            if getattr(self, name) is not None:
                require_positive(name, getattr(self, name))
        if self.pipeline_model_parallel_layout is not None:
            layout = self.pipeline_model_parallel_layout
            require(isinstance(layout, str) and normalize_layout(layout) != "",
                    f"`pipeline_model_parallel_layout` must be a layout string such as 'Et|(tt|)*30mL', but got "
                    f"(pipeline_model_parallel_layout={layout!r})")
            object.__setattr__(self, "pipeline_model_parallel_layout", normalize_layout(layout))
            parse_layout(self.pipeline_model_parallel_layout)  # the characters, checked early
        if self.recompute_modules is not None:
            modules = (self.recompute_modules,) if isinstance(self.recompute_modules, str) else self.recompute_modules
            object.__setattr__(self, "recompute_modules", tuple(modules))
            for module in self.recompute_modules:
                require(module in RECOMPUTE_MODULE_REGIONS,
                        f"`recompute_modules` entry {module!r} is not modelled (echo-tune models "
                        f"{', '.join(RECOMPUTE_MODULE_REGIONS)}); remove it")
        require_choice("recompute_granularity", self.recompute_granularity, RECOMPUTE_GRANULARITIES)
        require_choice("recompute_method", self.recompute_method, RECOMPUTE_METHODS)
        require_choice("precision", self.precision, PRECISIONS)
        require_choice("fp8_format", self.fp8_format, FP8_FORMATS)
        require_choice("main_params_dtype", self.main_params_dtype, ("fp32", "fp16"))
        require_choice("main_grads_dtype", self.main_grads_dtype, ("fp32", "bf16"))
        require_choice("exp_avg_dtype", self.exp_avg_dtype, tuple(STATE_DTYPE_BYTES))
        require_choice("exp_avg_sq_dtype", self.exp_avg_sq_dtype, tuple(STATE_DTYPE_BYTES))
        require_choice("fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        require_choice("fp4_format", self.fp4_format, FP4_FORMATS)
        require_choice("fp4_recipe", self.fp4_recipe, FP4_RECIPES)
        require(self.fp4_format is None or self.fp8_format is None,
                f"--fp4-format and --fp8-format cannot be used simultaneously (Megatron-LM validate_args), but got "
                f"(fp4_format={self.fp4_format!r}, fp8_format={self.fp8_format!r}); choose one")
        if self.hierarchical_context_parallel_sizes is not None:
            sizes = tuple(self.hierarchical_context_parallel_sizes)
            for size in sizes:
                require(isinstance(size, int) and not isinstance(size, bool) and size > 0,
                        f"`hierarchical_context_parallel_sizes` must be positive integers, but got "
                        f"(hierarchical_context_parallel_sizes={list(sizes)})")
            object.__setattr__(self, "hierarchical_context_parallel_sizes", sizes)
        for name in ("cuda_graph_modules", "cuda_graph_scope", "offload_modules"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))
        require_choice("cuda_graph_impl", self.cuda_graph_impl, CUDA_GRAPH_IMPLS)
        self._check_optimizer()
        require_positive("num_distributed_optimizer_instances", self.num_distributed_optimizer_instances)
        for name in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "wgrad_deferral_limit",
                     "cuda_graph_warmup_steps"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 0, f"`{name} >= 0` must hold, but got ({name}={value!r})")

    @property
    def fp8(self) -> bool:
        """True when the linear GEMMs run in FP8."""
        return self.fp8_format is not None

    @property
    def quantized_recipe(self) -> str | None:
        """The recipe of the TE linears' low-precision GEMMs: nvfp4, the FP8 recipe, or None (bf16)."""
        if self.fp4_format is not None:
            return self.fp4_recipe
        return self.fp8_recipe if self.fp8 else None

    @property
    def grad_bytes_per_param(self) -> float:
        """Bytes of one gradient in DDP's grad buffer (and reduce-scatter): fp32 for bf16 training (Megatron sets
        accumulate_allreduce_grads_in_fp32, training/arguments.py) unless ``--grad-reduce-in-bf16`` or
        ``--main-grads-dtype bf16``; the 2-byte dtype for fp16; fp32 for fp32."""
        if self.precision == "fp16":
            return 2.0
        if self.precision == "bf16" and (self.grad_reduce_in_bf16 or self.main_grads_dtype == "bf16"):
            return 2.0
        return 4.0

    @property
    def recompute_regions(self) -> tuple[str, ...]:
        """Traced regions that selective recompute replays."""
        modules = self.recompute_modules or ("core_attn",)
        return tuple(r for module in modules for r in RECOMPUTE_MODULE_REGIONS[module])

    @property
    def recompute_discarding_regions(self) -> tuple[str, ...]:
        """Of ``recompute_regions``, those whose outputs are discarded and recomputed too."""
        modules = self.recompute_modules or ("core_attn",)
        return tuple(r for module in modules if module in OUTPUT_DISCARDING_MODULES
                     for r in RECOMPUTE_MODULE_REGIONS[module])

    @property
    def expert_tensor_size(self) -> int:
        """ETP in effect: Megatron sets it to TP when unset (arguments.py, validate_args)."""
        return self.expert_tensor_parallel_size or self.tensor_model_parallel_size

    def replace(self, **changes) -> "ParallelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        # asdict's deep copy, without its cost (paid three times per layout a search simulates: its params, its
        # record, the simulation's config): built once per instance; only values that could be changed in
        # place (none today) are copied again per call
        cached = self.__dict__.get("_as_dict")
        if cached is None:
            values = {f.name: _copy_value(getattr(self, f.name)) for f in dataclasses.fields(self)}
            cached = (values, tuple(k for k, v in values.items() if not _immutable(v)))
            object.__setattr__(self, "_as_dict", cached)
        values, mutable = cached
        out = dict(values)
        for key in mutable:
            out[key] = copy.deepcopy(values[key])
        return out

    def __getstate__(self) -> dict:
        """Pickled without ``to_dict``'s cache (a search sends layouts to its worker processes)."""
        state = dict(self.__dict__)
        state.pop("_as_dict", None)
        return state


_PLAIN = (str, int, float, bool, type(None))


def _immutable(value) -> bool:
    return isinstance(value, _PLAIN) or (type(value) is tuple and all(_immutable(v) for v in value))


def _copy_value(value):
    return value if isinstance(value, _PLAIN) else copy.deepcopy(value)
