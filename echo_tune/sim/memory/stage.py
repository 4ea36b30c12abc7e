"""Peak GPU memory per pipeline stage: weights, gradients, optimizer states, activations.

Each allocation as Megatron-LM makes it (d98e8a64ddf3):
- weights: the bf16/fp16 model parameters in DDP's contiguous param buffer, 2 bytes each
  (megatron/core/distributed/param_and_grad_buffer.py). Under ``--fp8-format`` Transformer Engine
  also keeps the FP8 weights of the linear layers for the whole step (a row-wise and a transposed copy,
  1 byte each, cached over micro-batches); with ``--fp8-param-gather`` the FP8 weight is the model
  parameter itself (no bf16 copy): 1 + 1 bytes instead of 2 + 2.
- gradients: the main-grad buffer, fp32 (4 bytes) for bf16 training because Megatron sets
  ``accumulate_allreduce_grads_in_fp32`` (training/arguments.py), bf16 (2) with
  ``--grad-reduce-in-bf16``, fp16 (2) for fp16. It is not sharded: the distributed optimizer
  reduce-scatters into it.
- optimizer: fp32 master parameters plus Adam's exp_avg and exp_avg_sq, 4 + 4 + 4 bytes (or the
  ``--main-params-dtype`` / ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` sizes with
  ``--use-precision-aware-optimizer``, core/optimizer/optimizer_config.py; there TE keeps fp32 masters of
  bf16 parameters as 2-byte remainders, ``master_param_bytes``), divided with the
  distributed optimizer over the data-parallel ranks *including context-parallel ranks*: its
  gradient buffers and shards use the DP x CP group (core/distributed/distributed_data_parallel.py
  builds them on ``get_data_parallel_group(with_context_parallel=True)``). This matches the
  distributed-optimizer table (docs/source/api-guide/dist_optimizer.md: 6 + 12/d bytes for bf16
  parameters with fp32 gradients) and ``compute_weight_and_optimizer_memory`` in
  training/theoretical_memory_usage.py (18 bytes, or 6 + 12/d with the distributed optimizer, d
  = DP x CP).

With ``--optimizer muon`` the 2-D weight matrices keep one state less (a momentum, no second moment;
sim/data_parallel/optimizer_muon.py), and its layer-wise distributed optimizer gives each data-parallel rank whole tensors, so
ranks can differ (sim/data_parallel/muon_shards.py): a stage's memory is its last rank's (the one Megatron logs), and
``dp_spread_bytes`` what its most loaded rank holds more.

With ``--num-distributed-optimizer-instances N`` the optimizer states are sharded over DP x CP / N ranks
(sim/data_parallel/dp_instances.py). CUDA graphs add their static buffers (``cuda_graph_bytes``, sim/features/cuda_graphs.py).

Activations are the traced saved-tensor bytes of each micro-batch, times the largest number of
micro-batches whose backward has not run yet under the stage's schedule (from the task order; the
same count as theoretical_memory_usage.py's interleaved penalty). Full recompute keeps only each
checkpoint's input, plus one recompute unit materialised at a time; selective recompute drops the
tensors created and saved inside the recomputed regions (core attention by default;
``--recompute-modules``); FP8 linear layers save their input in FP8 (``cost/kernels/fp8.py``), in MoE layers
too (routed and shared experts), and TE's FP8 weight copies are counted on each layer's FP8 linear
weights as traced (``Trace.linear_param_counts``: a MoE layer's local experts and shared expert, not
its router or norms).
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.specs.cluster import GPUSpec
from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import STATE_DTYPE_BYTES, ParallelConfig
from echo_tune.cost.kernels.fp8 import (ACTIVATION_BYTES, fp8_activation_savings_bytes, fp8_linear_param_count,
                                        operand_bytes)
from echo_tune.sim.memory.allocator_memory import loss_working_bytes, workspace_bytes
from echo_tune.sim.features.activation_offload import kept_back_bytes
from echo_tune.sim.features.cpu_offload import kept_fraction
from echo_tune.sim.schedule.linear_layers import PIECES as LINEAR_PIECES, linear_activation_delta
from echo_tune.sim.features.cuda_graphs import full_iteration_batch_bytes, graph_static_bytes_per_layer
from echo_tune.sim.data_parallel.fsdp import fsdp_memory_bytes
from echo_tune.sim.data_parallel.muon_shards import mtp_tensors, optimizer_bytes as muon_optimizer_bytes, stage_tensors
from echo_tune.sim.schedule.schedules import after_forward_peak_bytes, peak_in_flight_bytes
from echo_tune.workload.graph import Trace

# Memory outside PyTorch's caching allocator that nvidia-smi counts against the HBM: the CUDA context
# with its loaded kernels (~0.5 GiB on A100/H100 with lazy module loading) and NCCL's per-peer channel
# buffers (a few hundred MiB for TP + DP + PP communicators): ~1 GiB. The cuBLAS / TE workspaces are
# allocator blocks, counted apart (``StageMemory.workspace_bytes``, sim/memory/allocator_memory.py).
RUNTIME_RESERVE_BYTES = 1 << 30
# Safety margin a *recommended* layout keeps below the HBM limit (``--memory-headroom-gib``): the caching
# allocator's fragmentation (reserved minus allocated memory; blocks split across micro-batches of
# different lifetimes) is not in the byte count above. 2 GiB (~2.5% of an 80 GB GPU) is an assumption,
# not a measurement: large enough that a layout 0.2 GiB under the limit is not recommended, small enough
# not to exclude layouts that published runs use.
DEFAULT_MEMORY_HEADROOM_GIB = 2.0


def bytes_per_param(parallel: ParallelConfig, data_parallel_size: int,
                    context_parallel_size: int = 1) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes per parameter on one rank (FP8 copies apart)."""
    if parallel.precision == "fp32":
        weights, grads, optimizer = 4.0, 4.0, 8.0  # Adam m and v; the parameter is its own master
    else:
        weights = 2.0
        grads = parallel.grad_bytes_per_param  # 2 with --grad-reduce-in-bf16 or --main-grads-dtype bf16
        optimizer = 12.0
        if parallel.use_precision_aware_optimizer:
            optimizer = master_param_bytes(parallel) + sum(STATE_DTYPE_BYTES[d] for d in (parallel.exp_avg_dtype,
                                                                                           parallel.exp_avg_sq_dtype))
    if parallel.use_distributed_optimizer:
        optimizer /= data_parallel_size * context_parallel_size
    return weights, grads, optimizer


def master_param_bytes(parallel: ParallelConfig) -> float:
    """Bytes of one master parameter under ``--use-precision-aware-optimizer``.

    Megatron-LM d98e8a64ddf3 core/optimizer/optimizer_config.py: ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``
    (main params not fp32, or no FP8 / delayed-scaling FP8) hands the master weights to TE's FusedAdam
    (core/optimizer/__init__.py ``master_weights=True``) with ``store_param_remainders`` (default True): for bf16
    parameters and fp32 masters it keeps only the 16 low bits of each fp32 master (an int16 shard,
    distrib_optimizer.py), the high 16 being the bf16 parameter itself: 2 bytes. Otherwise (FP8 current
    scaling / blockwise / mxfp8 with fp32 masters) Megatron-Core keeps full ``main_params_dtype`` masters."""
    te_masters = parallel.main_params_dtype != "fp32" or not parallel.fp8 or parallel.fp8_recipe == "delayed"
    if te_masters and parallel.precision == "bf16" and parallel.main_params_dtype == "fp32":
        return 2.0
    return STATE_DTYPE_BYTES[parallel.main_params_dtype]


def fp8_weight_bytes_per_param(parallel: ParallelConfig) -> float:
    """Extra bytes per linear-layer parameter under FP8 (see the module docstring); NVFP4: a row-wise and a
    column-wise copy of 0.5 B and one E4M3 scale per 16x16 block each, beside the bf16 weight (cost/kernels/fp8.py)."""
    if parallel.quantized_recipe == "nvfp4":
        return 2 * (0.5 + 1.0 / 256)
    if not parallel.fp8:
        return 0.0
    if parallel.fp8_param_gather:  # 1 + 1 FP8 copies replace the weight (2 B bf16: no change; 4 B fp32: 2 B less)
        return 2.0 - ACTIVATION_BYTES[parallel.precision]
    return 2.0  # beside the weight


def fp8_main_copy_bytes_per_param(parallel: ParallelConfig, shard: int) -> float:
    """Bytes per linear-layer parameter of the fp32 main copy the distributed optimizer makes of an FP8 weight
    (``--fp8-param-gather``) in fp32 training, where the other parameters are their own masters (Megatron-LM
    d98e8a64ddf3 distrib_optimizer.py ``_build_model_and_main_param_groups``: FP8 and 16-bit model parameters get a
    float32 main shard), sharded over ``shard`` ranks."""
    return 4.0 / shard if parallel.fp8_param_gather and parallel.precision == "fp32" else 0.0


def saved_bytes_less_per_element(parallel: ParallelConfig) -> float:
    """What a linear's saved input weighs less per element than in the training precision: 1 B from bf16 (an FP8
    copy; 3 B from fp32), 1.4375 B (NVFP4's 0.5 B with its scale per 16 elements)."""
    if not parallel.quantized_recipe:
        return 0.0
    return ACTIVATION_BYTES[parallel.precision] - operand_bytes(parallel.quantized_recipe)


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    stage: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    reserve_bytes: int = RUNTIME_RESERVE_BYTES
    cuda_graph_bytes: int = 0
    """Static input / output buffers of CUDA graphs (sim/features/cuda_graphs.py), at the stage's activation peak."""
    fsdp_buffer_bytes: int = 0
    """Megatron-FSDP's unsharded working buffers of the units in flight (sim/memory/fsdp_memory.py)."""
    workspace_bytes: int = 0
    """cuBLAS and Transformer Engine workspaces, allocator blocks held all run (sim/memory/allocator_memory.py)."""
    dp_spread_bytes: int = 0
    """What the stage's most loaded data-parallel rank holds above this one, its last (Muon's layer-wise
    distributed optimizer without its param layout deals whole tensors to ranks; sim/data_parallel/muon_shards.py)."""

    @property
    def steady_bytes(self) -> int:
        """What the allocator holds between steps (Megatron's ``mem-allocated-bytes`` after a step): the
        weights, gradient buffer, optimizer states, workspaces and CUDA graphs' static buffers (made at
        capture for every micro-batch slot and kept for the run, sim/features/cuda_graphs.py); no activations, no
        runtime reserve."""
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.workspace_bytes
                + self.cuda_graph_bytes)

    @property
    def floor_bytes(self) -> int:
        """What no activation-recompute setting changes, of ``worst_rank_bytes``: weights, gradient buffer,
        optimizer states, workspaces, runtime reserve, the data-parallel spread (not activations, CUDA graphs'
        buffers or FSDP's, which recompute can change): a lower bound of the stage's memory under any recompute
        (search/space/dominance.py)."""
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.workspace_bytes
                + self.reserve_bytes + self.dp_spread_bytes)

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.reserve_bytes + self.cuda_graph_bytes + self.fsdp_buffer_bytes + self.workspace_bytes)

    @property
    def worst_rank_bytes(self) -> int:
        """``total_bytes`` of the stage's most loaded data-parallel rank: what must fit."""
        return self.total_bytes + self.dp_spread_bytes


def layer_activation_bytes(layer: Trace, layout: Layout, layers: int) -> tuple[float, float]:
    """(bytes kept per micro-batch, transient recompute bytes) for ``layers`` layers of one chunk."""
    full = float(layer.activation_bytes)
    if layout.recompute_granularity == "selective":
        # what recomputing the selected regions frees: the tensors created and saved inside each of them
        freed = sum((layer.region_created_bytes if region in layout.recompute_discarding_regions
                     else layer.region_internal_bytes).get(region, 0) for region in layout.recompute_regions)
        return layers * (full - freed), 0.0
    if layout.recompute_granularity != "full":
        return layers * full, 0.0
    k = layout.recompute_num_layers or 1
    if layout.recompute_method == "block":
        recomputed = min(k, layers)
        kept = recomputed * layer.input_bytes + (layers - recomputed) * full
        return kept, full  # recomputed one layer at a time
    units = -(-layers // k)
    return units * layer.input_bytes, min(k, layers) * full


def stage_memory(stage: int, layout: Layout, parallel: ParallelConfig, pieces: dict[str, Trace],
                 params_on_rank: int, schedule: str, *, mix: tuple[tuple[int, int], ...] | None = None,
                 expert_params_on_rank: int = 0, model: ModelSpec | None = None,
                 gpu: GPUSpec | None = None, linear: tuple[tuple[int, int], ...] | None = None,
                 offload_drained: list[float] | None = None) -> StageMemory:
    """Peak memory of the last rank of ``stage`` (and ``dp_spread_bytes``, see StageMemory).

    MoE: ``mix[chunk]`` = (dense, MoE) layers; of ``params_on_rank``, ``expert_params_on_rank`` are routed
    experts, whose optimizer states the distributed optimizer shards over the expert-data-parallel group.
    ``model`` adds the loss's working set, ``model`` and ``gpu`` the GEMM workspaces (sim/memory/allocator_memory.py).
    ``linear[chunk]``: the (dense, MoE) layers of ``mix[chunk]`` that run the gated delta net (sim/schedule/linear_layers.py).
    ``offload_drained[chunk]``: the activation bytes of a micro-batch fine-grained offloading moves to the host
    (sim/features/activation_offload.py ``stage_drained_bytes``); one layer's groups stay besides (``kept_back_bytes``).
    """
    v = layout.virtual_pipeline_size
    chunk_bytes, transient = [], 0.0

    # FP8 linears (dense and MoE alike) save their inputs in FP8; not what full or selective recompute drops
    recomputed = layout.recompute_regions if layout.recompute_granularity == "selective" else ()
    fp8_saved = {piece: fp8_activation_savings_bytes(pieces[piece], parallel.tensor_model_parallel_size,
                                                     layout.sequence_parallel, recomputed)
                 * saved_bytes_less_per_element(parallel)
                 if parallel.quantized_recipe and layout.recompute_granularity != "full" and piece in pieces else 0.0
                 for piece in ("layer", "moe_layer", "linear_layer", "moe_linear_layer")}
    dense_layers = moe_layers = 0
    loss_chunk, loss_bytes = None, 0.0
    graph_bytes = []  # per chunk and micro-batch in flight: CUDA graphs' static buffers
    for chunk, layers in enumerate(layout.stage_chunk_layers[stage]):
        dense, moe = mix[chunk] if mix else (layers, 0)  # (MTP layers included in ``mix``)
        boundary = pieces["layer"].input_bytes
        captured = layout.cuda_graphs
        graph_bytes.append(graph_static_bytes_per_layer(parallel, model, "layer", boundary, dense, captured)
                           + graph_static_bytes_per_layer(parallel, model, "moe_layer", boundary, moe, captured)
                           if model is not None else 0.0)
        dense_layers, moe_layers = dense_layers + dense, moe_layers + moe
        kept, extra = layer_activation_bytes(pieces["layer"], layout, dense) if dense else (0.0, 0.0)
        kept -= dense * fp8_saved["layer"]
        if moe:
            moe_kept, moe_extra = layer_activation_bytes(pieces["moe_layer"], layout, moe)
            kept, extra = kept + moe_kept - moe * fp8_saved["moe_layer"], max(extra, moe_extra)
        if linear and any(linear[chunk]):  # gated-delta-net layers keep other activations than self-attention
            more, linear_extra = linear_activation_delta(pieces, layout, linear[chunk], layers, fp8_saved,
                                                         layer_activation_bytes)
            kept, extra = kept + more, max(extra, linear_extra)
        kept *= kept_fraction(layers, parallel.cpu_offloading_num_layers)  # offloaded to the host (sim/features/cpu_offload.py)
        if offload_drained:  # fine-grained offloading: copied to the host during the chunk's forward
            kept -= offload_drained[chunk]
        contents = layout.chunk_contents[stage][chunk]
        if contents.embedding:
            kept += pieces["embedding"].activation_bytes
        if contents.loss:
            # the logits / loss tensors live only between the loss chunk's forward and its backward, with the
            # bf16 logits (and the native fused path's second fp32 copy) beside the saved fp32 tensor
            loss_chunk = chunk
            loss_bytes = pieces["output"].activation_bytes + (loss_working_bytes(model, parallel) if model else 0)
        chunk_bytes.append(kept)
        transient = max(transient, extra)
    # live micro-batches per chunk over the stage's schedule (cached per pipeline structure)
    group = parallel.microbatch_group_size_per_vp_stage  # the interleaved schedule's group size (None: p)
    grouping = [group] if group else []
    p = len(layout.stage_chunk_layers)
    in_flight = peak_in_flight_bytes(schedule, stage, p, layout.num_micro_batches, v, chunk_bytes, *grouping)
    activations = in_flight + transient
    if loss_chunk is not None:  # the loss's bytes on what is live right after a forward of its chunk (the same
        # state as the peak without interleaving; with it, the other chunks may hold fewer micro-batches then)
        activations = max(activations, loss_bytes + after_forward_peak_bytes(
            schedule, stage, p, layout.num_micro_batches, v, loss_chunk, chunk_bytes, *grouping))
    if offload_drained and model is not None:  # fine-grained offloading: one layer's groups kept back
        activations += kept_back_bytes(pieces, model, parallel, layout, [mix[c] if mix else (n, 0) for c, n in
                                                                         enumerate(layout.stage_chunk_layers[stage])])
    graphs = 0.0
    if any(graph_bytes):  # kept as long as the micro-batch's activations: the peak of the sum, less theirs
        graphs = peak_in_flight_bytes(schedule, stage, p, layout.num_micro_batches, v,
                                      [a + g for a, g in zip(chunk_bytes, graph_bytes)], *grouping) - in_flight
    if model is not None:
        graphs += full_iteration_batch_bytes(parallel, model, layout)
    w, g, o = bytes_per_param(parallel, layout.data_parallel_size, parallel.context_parallel_size)
    linear_params = fp8_linear_param_count(pieces["layer"]) * dense_layers
    if moe_layers:
        linear_params += fp8_linear_param_count(pieces["moe_layer"]) * moe_layers
    for (_, full, piece), count in zip(LINEAR_PIECES, map(sum, zip(*linear)) if linear else ()):
        if count and piece in pieces:  # the gated delta net's in_proj / out_proj in place of QKV / projection
            linear_params += count * (fp8_linear_param_count(pieces[piece]) - fp8_linear_param_count(pieces[full]))
    weights = w * params_on_rank + fp8_weight_bytes_per_param(parallel) * linear_params
    optimizer = o * (params_on_rank - expert_params_on_rank) + linear_params * fp8_main_copy_bytes_per_param(
        parallel, layout.data_parallel_size * parallel.context_parallel_size)
    if parallel.use_distributed_optimizer:  # sharded over DP x CP / N only (sim/data_parallel/dp_instances.py): N copies
        optimizer *= parallel.num_distributed_optimizer_instances
    if expert_params_on_rank:
        # the expert-data-parallel group already spans the context-parallel ranks (parallel folding); with
        # N instances the experts' buffers shard over the intra-partial expert-DP group, expert DP / N
        # (core/distributed/distributed_data_parallel.py ``intra_expt_dp_group``, d98e8a64ddf3)
        expert = bytes_per_param(parallel, layout.expert_data_parallel_size)[2] * expert_params_on_rank
        if parallel.use_distributed_optimizer:
            expert *= parallel.num_distributed_optimizer_instances
        optimizer += expert
    grads, buffers = g * params_on_rank, 0.0
    if parallel.use_megatron_fsdp:  # sharded as --data-parallel-sharding-strategy says (sim/memory/fsdp_memory.py)
        weights, grads, optimizer, buffers = fsdp_memory_bytes(layout, parallel, pieces, stage, params_on_rank,
                                                               expert_params_on_rank)
        # (with --fp8-param-gather its sharded weights are counted at the parameter dtype: not fewer bytes)
        weights += (0.0 if parallel.fp8_param_gather else fp8_weight_bytes_per_param(parallel)) * linear_params
    spread = 0.0
    if model is not None and parallel.muon:  # whole tensors, one state less on its matrices (sim/data_parallel/muon_shards.py)
        chunk_mix = [mix[c] if mix else (n, 0) for c, n in enumerate(layout.stage_chunk_layers[stage])]
        tensors = stage_tensors(pieces, layout.chunk_contents[stage], chunk_mix,
                                mtp_tensors(model.hidden_size, parallel.tensor_model_parallel_size))
        optimizer, worst = muon_optimizer_bytes(parallel, layout, tensors)
        spread = worst - optimizer
    workspaces = workspace_bytes(gpu, model, parallel) if model is not None and gpu is not None else 0
    return StageMemory(stage=stage, weights_bytes=int(weights), gradients_bytes=int(grads),
                       optimizer_bytes=int(optimizer), activations_bytes=int(activations),
                       cuda_graph_bytes=int(graphs), fsdp_buffer_bytes=int(buffers), workspace_bytes=workspaces,
                       dp_spread_bytes=int(spread))
