"""The end of a step on one stage: gradient reduction over DP, embedding sync, optimizer step.

Megatron-Core's DDP reduces gradients in buckets (``--ddp-bucket-size``, default
max(40M, 1M x DP) parameters) once the last micro-batch's backward produced them. With
``overlap_grad_reduce`` each bucket starts as soon as its layers' backward is done, so most of the
reduction hides behind the remaining backward passes; without it, the whole buffer is reduced after
the backward. The distributed optimizer reduce-scatters instead of all-reducing and all-gathers the
updated bf16 parameters afterwards (hidden behind the next forward with ``overlap_param_gather``,
except the first bucket that the first layer waits for). ``--optimizer muon`` adds its Newton-Schulz
step to the optimizer time (sim/data_parallel/optimizer_muon.py, added in sim/simulate.py).
"""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass

from echo_tune.config.specs.layout import GroupPlacement
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import ClusterProfile
from echo_tune.sim.data_parallel.dp_instances import gradient_reduction_s, instance_groups
from echo_tune.identity_cache import IdentityCache

# Adam step per parameter on its owner (multi-tensor apply, memory-bound): fp32 master read+write 8,
# fp32 grad read 4, exp_avg and exp_avg_sq read+write 16, bf16/fp16 copy write 2, grad-norm read 4,
# zeroing the grad buffer 4 = 38 bytes.
OPTIMIZER_BYTES_PER_PARAM = 38.0
# --reuse-grad-buf-for-mxfp8-param-ag (Megatron-LM d98e8a64 param_and_grad_buffer.py ``_post_param_sync``): after a
# bucket's bf16 all-gather into the gradient buffer, ``copy_tensors_to_quantized_params`` re-quantises it into the
# MXFP8 parameters (read 2 B, write a row-wise and a column-wise e4m3 copy 2 B and their E8M0 scales, one byte per
# 32 elements each, 2/32 B) and the buffer is zeroed for the next gradient accumulation (2 B, bf16 gradients):
# memory-bound, on the compute stream before the bucket's first forward.
MXFP8_REQUANT_BYTES_PER_PARAM = 2.0 + 2.0 + 2.0 / 32 + 2.0
_DURATIONS = IdentityCache(limit=256)
_TAILS = IdentityCache(limit=8192)  # (end of the last reduction, its overlap) of ``_reduce_with_experts``


def ddp_bucket_params(data_parallel_size: int) -> int:
    """Megatron-Core's default DDP bucket size in parameters."""
    return max(40_000_000, 1_000_000 * data_parallel_size)


@dataclass(frozen=True, kw_only=True)
class StageTail:
    dp_exposed_s: float
    interference_s: float
    optimizer_s: float
    param_gather_hidden_s: float = 0.0
    """With ``--overlap-param-gather-with-optimizer-step``: the first bucket's all-gather time hidden behind the
    optimizer step of the other model chunks (not in ``optimizer_s``)."""


def grad_bytes_per_param(parallel: ParallelConfig) -> float:
    """Gradients are reduced in the main-grad dtype: fp32 for bf16 (Megatron accumulates in fp32)
    unless ``--grad-reduce-in-bf16`` or ``--main-grads-dtype bf16`` (``ParallelConfig.grad_bytes_per_param``)."""
    return parallel.grad_bytes_per_param


def stage_tail(*, parallel: ParallelConfig, dp: GroupPlacement, profile: ClusterProfile,
               chunk_params: list[int], chunk_backward: list[tuple[float, float]], compute_end_s: float,
               embedding_sync_s: float = 0.0, expert_chunk_params: list[int] | None = None,
               edp: GroupPlacement | None = None, spans: list | None = None) -> StageTail:
    """Exposed DP communication, its interference and the optimizer step of one stage.

    ``chunk_backward[c]`` is (start, end) of the last micro-batch's backward of chunk c.
    MoE: ``expert_chunk_params[c]`` of chunk c's parameters (included in ``chunk_params[c]``) are
    routed experts; Megatron-Core keeps them in separate buckets reduced over the expert-data-parallel
    group ``edp`` (and shards their optimizer states over it). They share the one DP stream here.
    ``spans``: if a list, each bucket's reduction is appended as (begin_s, end_s, params) (for the trace;
    the bucket-by-bucket loop is used then, equal to the closed form up to rounding).
    """
    # Muon's layer-wise distributed optimizer without its param layout all-reduces (sim/data_parallel/optimizer_muon.py)
    collective = "reduce_scatter" if parallel.use_distributed_optimizer and (
        not parallel.muon or parallel.use_layer_wise_param_layout) else "all_reduce"
    grad_bytes = grad_bytes_per_param(parallel)
    total_params = sum(chunk_params)
    bucket = ddp_bucket_params(dp.size) if parallel.overlap_grad_reduce else max(total_params, 1)
    # bucket params -> collective time: most buckets of a stage, and of its neighbours, have the same size
    instances = parallel.num_distributed_optimizer_instances if parallel.use_distributed_optimizer else 1

    def durations_over(group: GroupPlacement, group_instances: int):
        """bucket params -> its reduction over ``group``, remembered per profile (most buckets share a size)."""
        durations: dict[int, float] = _DURATIONS.get((profile,), (collective, grad_bytes, group, group_instances),
                                                     dict)

        def duration(params: int) -> float:
            if params not in durations:
                durations[params] = gradient_reduction_s(collective, params * grad_bytes, group, group_instances,
                                                         profile)
            return durations[params]
        return duration
    duration = durations_over(dp, instances)

    experts = expert_chunk_params or [0] * len(chunk_params)
    expert_total = sum(experts) if edp is not None else 0
    chunks = sorted(zip(chunk_backward, chunk_params))
    if expert_total:
        def reduced() -> tuple[float, float]:
            return _reduce_with_experts(parallel.overlap_grad_reduce, chunk_params, experts, chunk_backward, bucket,
                                        (duration, durations_over(edp, 1)), compute_end_s, profile.comm_slowdown,
                                        spans)
        # remembered by every argument the bucket loop reads (the durations by what they are computed from): a
        # search meets the same pipeline, so the same tail, in layouts that differ in memory only
        comm_end, overlap = reduced() if spans is not None else _TAILS.get(
            (profile,), (parallel.overlap_grad_reduce, collective, grad_bytes, dp, instances, edp, tuple(chunk_params),
                         tuple(experts), tuple(chunk_backward), bucket, compute_end_s), reduced)
    elif parallel.overlap_grad_reduce and _in_time_order(chunks, bucket) and spans is None:
        comm_end, overlap = _reduce_closed_form(chunks, bucket, duration, compute_end_s, profile.comm_slowdown)
    else:
        comm_end, overlap = _reduce_bucket_by_bucket(parallel.overlap_grad_reduce, chunk_params, chunk_backward,
                                                     bucket, duration, compute_end_s, profile.comm_slowdown, spans)
    dp_exposed = max(0.0, comm_end - compute_end_s) + embedding_sync_s
    dense_total = total_params - expert_total
    shard = instance_groups(dp, instances)[0] if instances > 1 else dp  # the optimizer states' shard group
    owned = (dense_total / shard.size + (expert_total / edp.size if expert_total else 0.0)) \
        if parallel.use_distributed_optimizer else total_params
    optimizer = owned * OPTIMIZER_BYTES_PER_PARAM / (profile.memory_bandwidth_gbyte_s * 1e9)
    hidden = 0.0
    if parallel.use_distributed_optimizer:
        # --fp8-param-gather all-gathers the (mostly linear-layer) weights in FP8; MXFP8 with the grad buffer reused
        # gathers them in bf16 and re-quantises them (MXFP8_REQUANT_BYTES_PER_PARAM)
        reuse = parallel.reuse_grad_buf_for_mxfp8_param_ag
        param_bytes = 1.0 if parallel.fp8_param_gather and not reuse else (2.0 if parallel.precision != "fp32" else 4.0)
        if reuse:
            optimizer += total_params * MXFP8_REQUANT_BYTES_PER_PARAM / (profile.memory_bandwidth_gbyte_s * 1e9)
        gathered = min(total_params, ddp_bucket_params(dp.size)) if parallel.overlap_param_gather else dense_total
        gather_s = collective_time_s("all_gather", gathered * param_bytes, shard, profile)
        if parallel.overlap_param_gather_with_optimizer_step:
            hidden = param_gather_hidden_s(gather_s, optimizer, chunk_params[0] - experts[0], dense_total)
        optimizer += gather_s - hidden
        if expert_total and not parallel.overlap_param_gather:
            optimizer += collective_time_s("all_gather", expert_total * param_bytes, edp, profile)
    return StageTail(dp_exposed_s=dp_exposed, interference_s=overlap * (profile.compute_slowdown - 1.0),
                     optimizer_s=optimizer, param_gather_hidden_s=hidden)


def param_gather_hidden_s(gather_s: float, adam_s: float, first_chunk_params: float, dense_params: float) -> float:
    """The first bucket's all-gather time hidden by ``--overlap-param-gather-with-optimizer-step``.

    Megatron-LM d98e8a64ddf3 core/optimizer/__init__.py gives the first model chunk an optimizer of its own;
    ChainedOptimizer._step (optimizer.py) steps it first, then dispatches that chunk's parameter all-gather
    (``start_param_sync(force_dispatch=True)``) while the other chunks' optimizers step. The next step's
    first forward waits for the first bucket only, so of its all-gather ``gather_s`` the part under the other
    chunks' share of the Adam step (``adam_s`` split in proportion to the dense parameters) is hidden:
    ``min(gather_s, adam_s * (1 - first_chunk_params / dense_params))``."""
    if dense_params <= 0:
        return 0.0
    return min(gather_s, adam_s * max(0.0, 1.0 - first_chunk_params / dense_params))


def _ready_s(start: float, end: float, i: int, n: int) -> float:
    """When bucket i of a chunk's n is ready: its share of the chunk's last backward is done."""
    return start + (end - start) * (i + 1) / n


def _reduce_bucket_by_bucket(overlap_grad_reduce: bool, chunk_params, chunk_backward, bucket: int, duration,
                             compute_end_s: float, comm_slowdown: float, spans: list | None = None
                             ) -> tuple[float, float]:
    """(end of the last reduction, time it overlapped compute), one bucket at a time in ready order."""
    buckets: list[tuple[float, int]] = []  # (ready time, params)
    for params, (start, end) in zip(chunk_params, chunk_backward):
        n = max(1, -(-params // bucket))
        for i in range(n):
            ready = _ready_s(start, end, i, n) if overlap_grad_reduce else compute_end_s
            buckets.append((ready, min(bucket, params - i * bucket)))
    comm_end, overlap = 0.0, 0.0
    for ready, params in sorted(buckets):
        before = comm_end
        comm_end, overlap = _one_bucket(ready, duration(params), comm_end, overlap, compute_end_s, comm_slowdown)
        if spans is not None:
            spans.append((max(ready, before), comm_end, params))
    return comm_end, overlap


def _reduce_with_experts(overlap_grad_reduce: bool, chunk_params, experts, chunk_backward, bucket: int,
                         durations, compute_end_s: float, comm_slowdown: float,
                         spans: list | None = None) -> tuple[float, float]:
    """``_reduce_bucket_by_bucket`` when a chunk's routed-expert gradients reduce over their own group:
    ``durations`` = (dense, expert) bucket params -> reduction time. Buckets run in order of (ready time,
    size), ties in the order made (a chunk's dense buckets before its expert buckets)."""
    dense_duration, expert_duration = durations
    buckets: list[tuple[float, int, int, float]] = []  # (ready time, params, order made, duration)
    append = buckets.append
    for params, expert, (start, end) in zip(chunk_params, experts, chunk_backward):
        span = end - start
        for count, duration in ((params - expert, dense_duration), (expert, expert_duration)):
            if count == 0 and duration is expert_duration:
                continue
            n = max(1, -(-count // bucket))
            if n > 1:  # every bucket but the last is full
                full_s, k = duration(bucket), len(buckets) - 1
                if overlap_grad_reduce:  # _ready_s inlined (the same arithmetic, so the same floats)
                    buckets += [(start + span * i / n, bucket, k + i, full_s) for i in range(1, n)]
                else:
                    buckets += [(compute_end_s, bucket, k + i, full_s) for i in range(1, n)]
            size = count - (n - 1) * bucket
            append((start + span * n / n if overlap_grad_reduce else compute_end_s, size, len(buckets),
                    duration(size)))
    buckets.sort()
    comm_end, overlap = 0.0, 0.0
    last_ready = buckets[-1][0] if buckets else 0.0
    for index, (ready, size, _, duration_s) in enumerate(buckets):  # _one_bucket, inlined: runs for every bucket
        if comm_end >= compute_end_s and comm_end >= last_ready and spans is None:
            # the compute has ended and every bucket left is ready: they run back to back at full speed (the
            # branch below for each, its additions in the same order, so the same float)
            return functools.reduce(operator.add, [b[3] for b in buckets[index:]], comm_end), overlap
        begin = ready if ready > comm_end else comm_end
        if begin < compute_end_s:
            comm_end = begin + duration_s * comm_slowdown
            if comm_end > compute_end_s:  # _slowed_end: full speed once the compute has ended
                comm_end = compute_end_s + duration_s - (compute_end_s - begin) / comm_slowdown
                overlap += compute_end_s - begin
            else:
                overlap += comm_end - begin
        else:
            comm_end = begin + duration_s
        if spans is not None:
            spans.append((begin, comm_end, size))
    return comm_end, overlap


def _slowed_end(begin: float, duration_s: float, compute_end_s: float, comm_slowdown: float) -> float:
    """End of a reduction that takes ``duration_s`` alone and begins at ``begin`` (before the compute ends):
    it runs ``comm_slowdown`` times slower while the compute runs beside it and at full speed after. (Slowing
    the whole of it, as before, let a bucket that began just after the compute end finish sooner than one
    that began just before: the step was not monotone in its passes' durations.)"""
    slowed_end = begin + duration_s * comm_slowdown
    if slowed_end <= compute_end_s:
        return slowed_end
    return compute_end_s + duration_s - (compute_end_s - begin) / comm_slowdown


def _one_bucket(ready: float, duration_s: float, comm_end: float, overlap: float, compute_end_s: float,
                comm_slowdown: float) -> tuple[float, float]:
    begin = max(ready, comm_end)
    if begin < compute_end_s:
        overlap += min(begin + duration_s * comm_slowdown, compute_end_s) - begin
        return _slowed_end(begin, duration_s, compute_end_s, comm_slowdown), overlap
    return begin + duration_s, overlap


def _in_time_order(chunks, bucket: int) -> bool:
    """Chunks sorted by start whose buckets' ready times do not interleave (true of any real schedule:
    a stage runs one backward at a time), so buckets reduce chunk after chunk."""
    prev_end = -math.inf
    for (start, end), params in chunks:
        n = max(1, -(-params // bucket))
        if end <= start or _ready_s(start, end, 0, n) <= prev_end:
            return False
        prev_end = end
    return True


def _reduce_closed_form(chunks, bucket: int, duration, compute_end_s: float,
                        comm_slowdown: float) -> tuple[float, float]:
    """``_reduce_bucket_by_bucket`` with the equal buckets of each chunk in closed form.

    A chunk's n - 1 full buckets are ready at r0 + i * gap and each takes d (slowed by comm_slowdown while
    the compute runs, ``_slowed_end``). Starting from ``comm_end`` = c, bucket i starts at
    max(c + i * ds, r0 + i * max(gap, ds)) while the compute runs (ds = slowed d); once one starts after
    the compute ended, every later one is ready and runs back to back. Equal to the bucket-by-bucket loop
    up to rounding (relative 1e-12; the tests check it).
    """
    comm_end, overlap = 0.0, 0.0
    for (start, end), params in chunks:
        n = max(1, -(-params // bucket))
        full = n - 1
        if full:
            d = duration(bucket)
            r0, gap = _ready_s(start, end, 0, n), (end - start) / n
            if d <= 0.0:
                comm_end = max(comm_end, _ready_s(start, end, full - 1, n))
            else:
                comm_end, overlap = _equal_buckets(full, d, r0, gap, comm_end, overlap, compute_end_s,
                                                   comm_slowdown)
        last = params - full * bucket
        comm_end, overlap = _one_bucket(_ready_s(start, end, full, n), duration(last), comm_end, overlap,
                                        compute_end_s, comm_slowdown)
    return comm_end, overlap


def _equal_buckets(count: int, d: float, r0: float, gap: float, comm_end: float, overlap: float,
                   compute_end_s: float, comm_slowdown: float) -> tuple[float, float]:
    ds = d * comm_slowdown
    pace = max(gap, ds)

    def begin(i: int) -> float:
        return max(comm_end + i * ds, r0 + i * pace)

    # k: how many of the buckets start before the compute ends (begin is increasing in i)
    k = min(count, max(0, math.ceil((compute_end_s - comm_end) / ds)), max(0, math.ceil((compute_end_s - r0) / pace)))
    while k > 0 and begin(k - 1) >= compute_end_s:
        k -= 1
    while k < count and begin(k) < compute_end_s:
        k += 1
    end = comm_end
    if k > 0:  # only the last of them can run past the compute end (the next one starts after it)
        b = begin(k - 1)
        overlap += (k - 1) * ds + min(b + ds, compute_end_s) - b
        end = _slowed_end(b, d, compute_end_s, comm_slowdown)
    if k < count:  # every one is ready by the compute end: back to back after the one before
        end = (max(end, r0 + k * gap) if k > 0 else begin(k)) + (count - k) * d
    return end, overlap
