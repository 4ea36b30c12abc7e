"""The parallel layout and training settings: one field per Megatron-LM argument.

Only user choices are fields. Derived values (data-parallel size, micro-batch count, layers per
stage) are computed by ``Layout`` in ``compatibility.py`` once the world size is known.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from echo_tune.config._checks import require, require_choice, require_positive
from echo_tune.config.specs.fsdp_fields import FsdpFields
from echo_tune.config.specs.optimizer_fields import OptimizerFields
from echo_tune.config.specs.precision_fields import PrecisionFields
from echo_tune.config.specs.schedule_fields import ScheduleFields

RECOMPUTE_GRANULARITIES = (None, "full", "selective")
RECOMPUTE_METHODS = (None, "uniform", "block")
# Optimizer-state dtypes of --exp-avg-dtype / --exp-avg-sq-dtype / --main-params-dtype and their bytes.
STATE_DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0}
# Megatron-Core's selective-recompute modules (transformer_config.py ``recompute_modules``) -> the traced
# regions they replay (workload/layers.py, mla.py, moe.py), "region/subregion" for a tagged part of a region:
# moe_act = the experts' activation of fc1's output (moe/experts.py ``bias_act_func``), shared_experts = the
# shared expert MLP (moe/moe_layer.py ``shared_experts_recompute``), Megatron-LM d98e8a64ddf3.
RECOMPUTE_MODULE_REGIONS = {"core_attn": ("core_attention",), "layernorm": ("input_norm", "mlp_norm"),
                            "mla_up_proj": ("mla_up_proj",), "mlp": ("mlp",), "moe": ("moe",)}
RECOMPUTE_MODULE_REGIONS.update({"moe_act": ("moe/expert_act",), "shared_experts": ("moe/shared",)})
# modules Megatron-Core checkpoints "output-discarding" (their outputs are freed too), the others keep outputs
# (transformer_config.py ``recompute_modules`` docstring, d98e8a64ddf3: moe_act uses CheckpointWithoutOutput)
OUTPUT_DISCARDING_MODULES = ("layernorm", "mla_up_proj", "moe_act")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig(ScheduleFields, FsdpFields, PrecisionFields, OptimizerFields):
    """A Megatron-LM parallel layout and the training settings that shape one step: the layout, batch, recompute,
    data-parallel and overlap fields here; precision (precision_fields.py), schedule features
    (schedule_fields.py), FSDP (fsdp_fields.py) and the optimizer (optimizer_fields.py) in their own rooms."""

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

    def __post_init__(self) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                     "micro_batch_size", "global_batch_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool),
                    f"`{name}` must be an integer, but got ({name}={value!r})")
            require_positive(name, value)
        for name in ("expert_model_parallel_size", "expert_tensor_parallel_size", "virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
                     "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                     "recompute_num_layers"):
            if getattr(self, name) is not None:
                require_positive(name, getattr(self, name))
        if self.recompute_modules is not None:
            modules = (self.recompute_modules,) if isinstance(self.recompute_modules, str) else self.recompute_modules
            object.__setattr__(self, "recompute_modules", tuple(modules))
            for module in self.recompute_modules:
                require(module in RECOMPUTE_MODULE_REGIONS,
                        f"`recompute_modules` entry {module!r} is not modelled (echo-tune models "
                        f"{', '.join(RECOMPUTE_MODULE_REGIONS)}); remove it")
        require_choice("recompute_granularity", self.recompute_granularity, RECOMPUTE_GRANULARITIES)
        require_choice("recompute_method", self.recompute_method, RECOMPUTE_METHODS)
        require_choice("main_params_dtype", self.main_params_dtype, ("fp32", "fp16"))
        require_choice("main_grads_dtype", self.main_grads_dtype, ("fp32", "bf16"))
        require_choice("exp_avg_dtype", self.exp_avg_dtype, tuple(STATE_DTYPE_BYTES))
        require_choice("exp_avg_sq_dtype", self.exp_avg_sq_dtype, tuple(STATE_DTYPE_BYTES))
        self._check_precision()
        self._check_schedule()
        self._check_optimizer()

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
