"""The end of a step on one stage: gradient reduction over DP, embedding sync, optimizer step.

Megatron-Core's DDP reduces gradients in buckets (``--ddp-bucket-size``, default
max(40M, 1M x DP) parameters) once the last micro-batch's backward produced them. With
``overlap_grad_reduce`` each bucket starts as soon as its layers' backward is done, so most of the
reduction hides behind the remaining backward passes; without it, the whole buffer is reduced after
the backward. The distributed optimizer reduce-scatters instead of all-reducing and all-gathers the
updated bf16 parameters afterwards (hidden behind the next forward with ``overlap_param_gather``,
except the first bucket that the first layer waits for).
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.compatibility import GroupPlacement
from echo_tune.config.parallel import ParallelConfig
from echo_tune.cost.comm import collective_time_s
from echo_tune.cost.profile import CalibrationProfile

# Adam step per parameter on its owner (multi-tensor apply, memory-bound): fp32 master read+write 8,
# fp32 grad read 4, exp_avg and exp_avg_sq read+write 16, bf16/fp16 copy write 2, grad-norm read 4,
# zeroing the grad buffer 4 = 38 bytes.
OPTIMIZER_BYTES_PER_PARAM = 38.0


def ddp_bucket_params(data_parallel_size: int) -> int:
    """Megatron-Core's default DDP bucket size in parameters."""
    return max(40_000_000, 1_000_000 * data_parallel_size)


@dataclass(frozen=True, kw_only=True)
class StageTail:
    dp_exposed_s: float
    interference_s: float
    optimizer_s: float


def grad_bytes_per_param(parallel: ParallelConfig) -> float:
    """Gradients are reduced in the main-grad dtype: fp32 for bf16 (Megatron accumulates in fp32)
    unless ``--grad-reduce-in-bf16``."""
    return 2.0 if parallel.precision == "fp16" or parallel.grad_reduce_in_bf16 else 4.0


def stage_tail(*, parallel: ParallelConfig, dp: GroupPlacement, profile: CalibrationProfile,
               chunk_params: list[int], chunk_backward: list[tuple[float, float]], compute_end_s: float,
               embedding_sync_s: float = 0.0, expert_chunk_params: list[int] | None = None,
               edp: GroupPlacement | None = None) -> StageTail:
    """Exposed DP communication, its interference and the optimizer step of one stage.

    ``chunk_backward[c]`` is (start, end) of the last micro-batch's backward of chunk c.
    MoE: ``expert_chunk_params[c]`` of chunk c's parameters (included in ``chunk_params[c]``) are
    routed experts; Megatron-Core keeps them in separate buckets reduced over the expert-data-parallel
    group ``edp`` (and shards their optimizer states over it). They share the one DP stream here.
    """
    collective = "reduce_scatter" if parallel.use_distributed_optimizer else "all_reduce"
    grad_bytes = grad_bytes_per_param(parallel)
    total_params = sum(chunk_params)
    bucket = ddp_bucket_params(dp.size) if parallel.overlap_grad_reduce else max(total_params, 1)
    experts = expert_chunk_params or [0] * len(chunk_params)
    buckets: list[tuple[float, int, GroupPlacement]] = []  # (ready time, params, group)
    for params, expert, (start, end) in zip(chunk_params, experts, chunk_backward):
        for count, group in ((params - expert, dp), (expert, edp)):
            if group is None or (count == 0 and group is edp):
                continue
            n = max(1, -(-count // bucket))
            for i in range(n):
                ready = start + (end - start) * (i + 1) / n if parallel.overlap_grad_reduce else compute_end_s
                buckets.append((ready, min(bucket, count - i * bucket), group))
    comm_end, overlap = 0.0, 0.0
    for ready, params, group in sorted(buckets, key=lambda b: (b[0], b[1])):
        duration = collective_time_s(collective, params * grad_bytes, group, profile)
        begin = max(ready, comm_end)
        if begin < compute_end_s:
            duration *= profile.comm_slowdown
            overlap += min(begin + duration, compute_end_s) - begin
        comm_end = begin + duration
    dp_exposed = max(0.0, comm_end - compute_end_s) + embedding_sync_s
    expert_total = sum(experts) if edp is not None else 0
    dense_total = total_params - expert_total
    owned = (dense_total / dp.size + expert_total / edp.size if expert_total else dense_total / dp.size) \
        if parallel.use_distributed_optimizer else total_params
    optimizer = owned * OPTIMIZER_BYTES_PER_PARAM / (profile.memory_bandwidth_gbyte_s * 1e9)
    if parallel.use_distributed_optimizer:
        # --fp8-param-gather all-gathers the (mostly linear-layer) weights in FP8
        param_bytes = 1.0 if parallel.fp8_param_gather else (2.0 if parallel.precision != "fp32" else 4.0)
        gathered = min(total_params, ddp_bucket_params(dp.size)) if parallel.overlap_param_gather else dense_total
        optimizer += collective_time_s("all_gather", gathered * param_bytes, dp, profile)
        if expert_total and not parallel.overlap_param_gather:
            optimizer += collective_time_s("all_gather", expert_total * param_bytes, edp, profile)
    return StageTail(dp_exposed_s=dp_exposed, interference_s=overlap * (profile.compute_slowdown - 1.0),
                     optimizer_s=optimizer)
