"""Peak GPU memory per pipeline stage: weights, gradients, optimizer states, activations.

Bytes per parameter follow Megatron-LM's distributed-optimizer table (docs/source/api-guide/
dist_optimizer.md): with bf16 parameters and fp32 gradient accumulation a rank holds 2 (param) + 4
(main grad) + 12 (fp32 master, Adam m and v) = 18 bytes per parameter, of which the 12 are divided
by DP with the distributed optimizer; fp16 keeps fp16 gradients (16 bytes, 4 + 12/DP).

Activations are the traced saved-tensor bytes of each micro-batch, times the largest number of
micro-batches whose backward has not run yet under the stage's schedule (from the task order).
Full recompute keeps only each checkpoint's input, plus one recompute unit materialised at a time;
selective recompute drops the core-attention tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.compatibility import Layout
from echo_tune.config.parallel import ParallelConfig
from echo_tune.sim.schedules import peak_in_flight_bytes
from echo_tune.workload.graph import Trace

# CUDA context, cuBLAS workspaces and NCCL buffers outside PyTorch's allocator: ~1 GiB is typical of
# an A100/H100 training process (CUDA context ~0.5 GiB, NCCL channel buffers a few hundred MiB).
RUNTIME_RESERVE_BYTES = 1 << 30


def bytes_per_param(parallel: ParallelConfig, data_parallel_size: int) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes per parameter on one rank."""
    if parallel.precision == "fp32":
        weights, grads, optimizer = 4.0, 4.0, 8.0  # Adam m and v; the parameter is its own master
    else:
        weights, grads, optimizer = 2.0, (4.0 if parallel.precision == "bf16" else 2.0), 12.0
    if parallel.use_distributed_optimizer:
        optimizer /= data_parallel_size
    return weights, grads, optimizer


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    stage: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    reserve_bytes: int = RUNTIME_RESERVE_BYTES

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.activations_bytes
                + self.reserve_bytes)


def layer_activation_bytes(layer: Trace, layout: Layout, layers: int) -> tuple[float, float]:
    """(bytes kept per micro-batch, transient recompute bytes) for ``layers`` layers of one chunk."""
    full = float(layer.activation_bytes)
    if layout.recompute_granularity == "selective":
        # what recomputing core attention alone frees: the tensors created and saved inside it
        return layers * (full - layer.region_internal_bytes.get("core_attention", 0)), 0.0
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
                 params_on_rank: int, schedule: str) -> StageMemory:
    """Peak memory of one rank of ``stage``."""
    p, v = len(layout.stage_chunk_layers), layout.virtual_pipeline_size
    chunk_bytes, transient = [], 0.0
    for chunk, layers in enumerate(layout.stage_chunk_layers[stage]):
        kept, extra = layer_activation_bytes(pieces["layer"], layout, layers)
        if stage == 0 and chunk == 0:
            kept += pieces["embedding"].activation_bytes
        if stage == p - 1 and chunk == v - 1:
            # the logits / loss tensors live only between the last forward and its backward
            transient = max(transient, pieces["output"].activation_bytes)
        chunk_bytes.append(kept)
        transient = max(transient, extra)
    # live micro-batches per chunk over the stage's schedule (cached per pipeline structure)
    activations = peak_in_flight_bytes(schedule, stage, p, layout.num_micro_batches, v, chunk_bytes) + transient
    w, g, o = bytes_per_param(parallel, layout.data_parallel_size)
    return StageMemory(stage=stage, weights_bytes=int(w * params_on_rank), gradients_bytes=int(g * params_on_rank),
                       optimizer_bytes=int(o * params_on_rank), activations_bytes=int(activations))
