"""Every rule that ties model, cluster, GPU count and layout together lives in ``check_compatible``.

It returns a ``Layout``: the derived values (data-parallel size, micro-batches, layers per stage and
chunk, which groups cross nodes) that the rest of echo-tune reads instead of recomputing them.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config._checks import require
from echo_tune.config.cluster import ClusterSpec
from echo_tune.config.expert_layout import expert_groups
from echo_tune.config.model import ModelSpec
from echo_tune.config.parallel import ParallelConfig
from echo_tune.config.schedule_rules import check_schedule_features

# Megatron-LM's rank order, innermost first (megatron/core/parallel_state.py, order "tp-cp-ep-dp-pp").
RANK_ORDER = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True, kw_only=True)
class GroupPlacement:
    """Where one process group's ranks sit: ``ranks_per_node`` members share a node, over ``num_nodes`` nodes."""

    size: int
    ranks_per_node: int
    num_nodes: int
    num_leaves: int = 1
    """Leaf switches the group's nodes hang from (ClusterSpec ``nodes_per_leaf``); 1 = one leaf or a flat fabric."""
    spine_oversubscription: float = 1.0
    """Oversubscription of the spine level a group spanning several leaves crosses (ClusterSpec key)."""

    @property
    def crosses_nodes(self) -> bool:
        return self.num_nodes > 1


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Derived values of a valid (model, cluster, num_gpus, parallel) combination."""

    num_gpus: int
    data_parallel_size: int
    num_micro_batches: int
    virtual_pipeline_size: int
    stage_chunk_layers: tuple[tuple[int, ...], ...]
    """Layers of each model chunk on each pipeline stage: ``stage_chunk_layers[stage][chunk]``."""
    schedule: str
    """"none" (no pipelining), "1f1b" or "interleaved"."""
    sequence_parallel: bool
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    recompute_regions: tuple[str, ...] = ("core_attention",)
    """Traced regions that selective recompute replays (``--recompute-modules``)."""
    recompute_discarding_regions: tuple[str, ...] = ()
    """Of those, the ones whose outputs are discarded too (output-discarding checkpointing)."""
    groups: dict[str, GroupPlacement]
    """tp, cp, dp, pp and the expert groups ep, etp, tpep (ETP x EP) and edp (expert data parallel)."""

    @property
    def expert_data_parallel_size(self) -> int:
        return self.groups["edp"].size

    @property
    def stage_layers(self) -> tuple[int, ...]:
        return tuple(sum(chunks) for chunks in self.stage_chunk_layers)


def _group_placements(parallel: ParallelConfig, cluster: ClusterSpec, dp: int) -> dict[str, GroupPlacement]:
    """Placement by NVLink domain: on a GB200 NVL72 rack 72 GPUs (18 trays) talk over NVLink, so a
    "node" here is the NVLink domain (``ClusterSpec.nvlink_domain_gpus``), not the compute tray."""
    domain = cluster.nvlink_domain_gpus
    sizes = {"tp": parallel.tensor_model_parallel_size, "cp": parallel.context_parallel_size,
             "dp": dp, "pp": parallel.pipeline_model_parallel_size}
    placements, stride = {}, 1
    for kind in RANK_ORDER:
        size = sizes[kind]
        per_node = max(1, min(size, domain // stride)) if stride < domain else 1
        span_nodes = (stride * (size - 1)) // cluster.gpus_per_node + 1  # physical nodes from first to last rank
        placements[kind] = GroupPlacement(size=size, ranks_per_node=per_node, num_nodes=-(-size // per_node),
                                          num_leaves=cluster.leaves_spanned(span_nodes),
                                          spine_oversubscription=cluster.spine_oversubscription)
        stride *= size
    return placements


def _split_layers(model: ModelSpec, parallel: ParallelConfig) -> tuple[int, ...]:
    """Layers per pipeline stage, honouring uneven first/last stages."""
    pp, total = parallel.pipeline_model_parallel_size, model.num_layers
    first, last = parallel.decoder_first_pipeline_num_layers, parallel.decoder_last_pipeline_num_layers
    extra = int(parallel.account_for_embedding_in_pipeline_split) + int(parallel.account_for_loss_in_pipeline_split)
    require(not extra or (first is None and last is None),
            "account_for_embedding/loss_in_pipeline_split do not combine with uneven first/last stages (Megatron "
            "refuses it, core/transformer/transformer_block.py); drop one of them")
    if extra:
        # Megatron counts the embedding (loss) as one more layer of the split (transformer_block.py
        # get_num_layers_to_build at d98e8a64ddf3); the first (last) model chunk builds one layer fewer.
        require((total + extra) % pp == 0,
                f"`(num_layers + {extra}) % pipeline_model_parallel_size == 0` must hold with "
                f"account_for_embedding/loss_in_pipeline_split, but got (num_layers={total}, "
                f"pipeline_model_parallel_size={pp})")
        return ((total + extra) // pp,) * pp
    if first is None and last is None:
        require(total % pp == 0,
                f"`num_layers % pipeline_model_parallel_size == 0` must hold, but got (num_layers={total}, "
                f"pipeline_model_parallel_size={pp}); pick a divisor of num_layers or set "
                f"decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers")
        return (total // pp,) * pp
    require(pp > 1, f"uneven pipeline stages need `pipeline_model_parallel_size > 1`, but got "
                    f"(pipeline_model_parallel_size={pp}, decoder_first_pipeline_num_layers={first}, "
                    f"decoder_last_pipeline_num_layers={last})")
    fixed = (first or 0) + (last or 0)
    middle = pp - (first is not None) - (last is not None)
    rest = total - fixed
    ok = rest > 0 and middle > 0 and rest % middle == 0 if middle else rest == 0
    require(ok, f"`(num_layers - first - last) % remaining stages == 0` must hold (and be positive), but got "
                f"(num_layers={total}, decoder_first_pipeline_num_layers={first}, "
                f"decoder_last_pipeline_num_layers={last}, remaining stages={middle}); adjust the first/last counts")
    inner = rest // middle if middle else 0
    stages = [inner] * pp
    if first is not None:
        stages[0] = first
    if last is not None:
        stages[-1] = last
    return tuple(stages)


def _virtual_size(parallel: ParallelConfig, stage_layers: tuple[int, ...]) -> int:
    vpp, per_chunk = parallel.virtual_pipeline_model_parallel_size, parallel.num_layers_per_virtual_pipeline_stage
    require(vpp is None or per_chunk is None,
            f"set only one of virtual_pipeline_model_parallel_size and num_layers_per_virtual_pipeline_stage, "
            f"but got (virtual_pipeline_model_parallel_size={vpp}, num_layers_per_virtual_pipeline_stage={per_chunk})")
    if per_chunk is not None:
        require(stage_layers[0] % per_chunk == 0,
                f"`layers per stage % num_layers_per_virtual_pipeline_stage == 0` must hold, but got "
                f"(layers per stage={stage_layers[0]}, num_layers_per_virtual_pipeline_stage={per_chunk})")
        vpp = stage_layers[0] // per_chunk
    return vpp or 1


def _check_fp8(model: ModelSpec, cluster: ClusterSpec, parallel: ParallelConfig) -> None:
    """FP8 rules of Megatron-LM d98e8a64ddf3 (training/arguments.py, core/transformer/transformer_config.py)."""
    fp8_only = [n for n in ("fp8_param_gather", "first_last_layers_bf16") if getattr(parallel, n)]
    if not parallel.fp8:
        require(not fp8_only, f"{fp8_only} need `fp8_format`, but got (fp8_format=None); add --fp8-format hybrid")
        return
    require(parallel.precision == "bf16",
            f"`fp8_format` runs beside bf16 parameters, but got (precision={parallel.precision!r}, "
            f"fp8_format={parallel.fp8_format!r}); launch with --bf16 --fp8-format")
    cluster.gpu.peak_tflops("fp8")  # refuses a GPU without FP8 tensor cores, by name
    require(parallel.fp8_recipe != "mxfp8" or cluster.gpu.peak_fp4_tflops is not None,
            f"`fp8_recipe == 'mxfp8'` needs Blackwell MX tensor cores, but got (gpu={cluster.gpu.name!r}); "
            f"use --fp8-recipe delayed, tensorwise or blockwise")
    require(not parallel.fp8_param_gather or parallel.use_distributed_optimizer,
            "`fp8_param_gather` needs `use_distributed_optimizer`, but got (fp8_param_gather=True, "
            "use_distributed_optimizer=False); add --use-distributed-optimizer")
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
    require(model.query_groups % tp == 0,
            f"`num_query_groups % tensor_model_parallel_size == 0` must hold, but got "
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
    per_step = parallel.micro_batch_size * dp
    require(parallel.global_batch_size % per_step == 0,
            f"`global_batch_size % (micro_batch_size * data_parallel_size) == 0` must hold, but got "
            f"(global_batch_size={parallel.global_batch_size}, micro_batch_size={parallel.micro_batch_size}, "
            f"data_parallel_size={dp}); change the batch sizes or the GPU split")
    num_micro_batches = parallel.global_batch_size // per_step

    stage_layers = _split_layers(model, parallel)
    vpp = _virtual_size(parallel, stage_layers)
    if vpp > 1:
        uneven = parallel.decoder_first_pipeline_num_layers or parallel.decoder_last_pipeline_num_layers
        require(not uneven, "interleaving with uneven first/last stages is not modelled; drop "
                            "virtual_pipeline_model_parallel_size or the decoder_first/last_pipeline_num_layers")
        require(pp > 1, f"the interleaved schedule needs `pipeline_model_parallel_size > 1`, but got "
                        f"(pipeline_model_parallel_size={pp}, virtual_pipeline_model_parallel_size={vpp})")
        require(stage_layers[0] % vpp == 0,
                f"`layers per stage % virtual_pipeline_model_parallel_size == 0` must hold, but got "
                f"(layers per stage={stage_layers[0]}, virtual_pipeline_model_parallel_size={vpp})")
        require(num_micro_batches % pp == 0,
                f"the interleaved schedule needs `num_micro_batches % pipeline_model_parallel_size == 0`, but got "
                f"(num_micro_batches={num_micro_batches}, pipeline_model_parallel_size={pp}); change "
                f"global_batch_size or micro_batch_size")
    chunks = [[layers // vpp] * vpp for layers in stage_layers]
    chunks[0][0] -= int(parallel.account_for_embedding_in_pipeline_split)
    chunks[-1][-1] -= int(parallel.account_for_loss_in_pipeline_split)
    require(chunks[0][0] >= 0 and chunks[-1][-1] >= 0,
            f"the first/last model chunk needs a layer to give up for the embedding/loss, but got "
            f"(layers per model chunk={stage_layers[0] // vpp})")
    chunks = tuple(tuple(c) for c in chunks)
    stage_layers = tuple(sum(c) for c in chunks)
    require(min(stage_layers) > 0, f"every pipeline stage needs at least one layer, but got "
                                   f"(stage layers={list(stage_layers)})")

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
            require(recompute_layers <= stage_layers[0] // vpp,
                    f"`recompute_num_layers <= layers per model chunk` must hold for block recompute, but got "
                    f"(recompute_num_layers={recompute_layers}, layers per model chunk={stage_layers[0] // vpp})")
    require(not parallel.overlap_param_gather or parallel.use_distributed_optimizer,
            "`overlap_param_gather` needs `use_distributed_optimizer`, but got (overlap_param_gather=True, "
            "use_distributed_optimizer=False); add --use-distributed-optimizer")
    # at TP=1 there is no TP communication to overlap: like sequence_parallel, the flag is a no-op
    require(not parallel.tp_comm_overlap or tp == 1 or sequence_parallel,
            f"`tp_comm_overlap` needs sequence_parallel when tensor_model_parallel_size > 1, but got "
            f"(tp_comm_overlap=True, sequence_parallel={parallel.sequence_parallel}, tensor_model_parallel_size={tp}); "
            f"add --sequence-parallel")
    _check_fp8(model, cluster, parallel)
    check_schedule_features(model, parallel, dp, vpp)
    precision_aware = (parallel.main_params_dtype, parallel.exp_avg_dtype, parallel.exp_avg_sq_dtype) != ("fp32",) * 3
    require(not precision_aware or parallel.use_precision_aware_optimizer,
            "main_params_dtype / exp_avg_dtype / exp_avg_sq_dtype apply with `use_precision_aware_optimizer`, but got "
            "(use_precision_aware_optimizer=False); add --use-precision-aware-optimizer")
    require(not parallel.use_precision_aware_optimizer or parallel.use_distributed_optimizer,
            "`use_precision_aware_optimizer` needs `use_distributed_optimizer`, but got "
            "(use_distributed_optimizer=False); add --use-distributed-optimizer")
    require(not parallel.grad_reduce_in_bf16 or parallel.precision == "bf16",
            f"`grad_reduce_in_bf16` needs bf16 training, but got (precision={parallel.precision!r})")
    schedule = "none" if pp == 1 else ("interleaved" if vpp > 1 else "1f1b")
    groups = _group_placements(parallel, cluster, dp) | expert_groups(model, parallel, dp, cluster.gpus_per_node,
                                                                      GroupPlacement)
    return Layout(num_gpus=num_gpus, data_parallel_size=dp, num_micro_batches=num_micro_batches,
                  virtual_pipeline_size=vpp, stage_chunk_layers=chunks, schedule=schedule,
                  sequence_parallel=sequence_parallel, recompute_granularity=granularity,
                  recompute_method=method, recompute_num_layers=recompute_layers,
                  recompute_regions=parallel.recompute_regions,
                  recompute_discarding_regions=parallel.recompute_discarding_regions,
                  groups=groups)
