"""The engine as it was before issue 12 (commit e758a95), kept verbatim to check the fast engine against;
``stage_tail`` as it stood just before the speed-up was merged (with the MoE expert buckets and the
FP8 / --grad-reduce-in-bf16 byte counts of those branches), so the closed form is checked against it; its
one change since: a bucket running past the compute end is slowed only while the compute runs (2026-12-02,
as ``echo_tune.sim.data_parallel.dp._slowed_end``).

Not used by the package: tests compare ``echo_tune.sim.schedule.engine`` and ``echo_tune.sim.data_parallel.dp`` with these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import ClusterProfile
from echo_tune.sim.data_parallel.dp import OPTIMIZER_BYTES_PER_PARAM, StageTail, ddp_bucket_params, grad_bytes_per_param

SCHEDULES = ("none", "gpipe", "1f1b", "interleaved")

Task = tuple[bool, int, int]


def _interleaved_ids(k: int, p: int, v: int, backward: bool) -> tuple[int, int]:
    """Micro-batch and chunk of the k-th forward (or backward) task of a stage."""
    in_group = k % (p * v)
    chunk = in_group // p
    if backward:
        chunk = v - 1 - chunk
    return (k // (p * v)) * p + k % p, chunk


def stage_order(schedule: str, stage: int, p: int, m: int, v: int = 1) -> list[Task]:
    """The task order of one pipeline stage."""
    if schedule == "none":
        return [task for mb in range(m) for task in ((False, mb, 0), (True, mb, 0))]
    if schedule == "gpipe":
        return [(False, mb, 0) for mb in range(m)] + [(True, mb, 0) for mb in range(m)]
    if schedule == "1f1b":
        warmup = min(p - stage - 1, m)
        order: list[Task] = [(False, mb, 0) for mb in range(warmup)]
        for i in range(m - warmup):
            order += [(False, warmup + i, 0), (True, i, 0)]
        return order + [(True, mb, 0) for mb in range(m - warmup, m)]
    if schedule == "interleaved":
        total = m * v
        warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
        order = [(False, *_interleaved_ids(k, p, v, False)) for k in range(warmup)]
        for k in range(total - warmup):
            order += [(False, *_interleaved_ids(k + warmup, p, v, False)),
                      (True, *_interleaved_ids(k, p, v, True))]
        return order + [(True, *_interleaved_ids(k, p, v, True)) for k in range(total - warmup, total)]
    raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")


def peak_in_flight(order: list[Task], v: int) -> list[int]:
    """Most forward passes of each chunk whose backward has not run yet (activations held)."""
    live, peak = [0] * v, [0] * v
    for backward, _, chunk in order:
        live[chunk] += -1 if backward else 1
        peak[chunk] = max(peak[chunk], live[chunk])
    return peak


def peak_in_flight_total(order: list[Task], chunk_bytes: list[float]) -> float:
    """Peak bytes of activations held, weighting each chunk's live micro-batches by its bytes."""
    live = peak = 0.0
    for backward, _, chunk in order:
        live += -chunk_bytes[chunk] if backward else chunk_bytes[chunk]
        peak = max(peak, live)
    return peak



@dataclass(frozen=True, kw_only=True)
class PipelineResult:
    end_s: tuple[float, ...]
    """Per stage: end of its last compute task."""
    critical_p2p_s: tuple[float, ...]
    """Per stage: p2p time on the critical path that ends at that stage's last task."""
    last_backward_end_s: tuple[tuple[float, ...], ...]
    """Per stage and chunk: end of the last micro-batch's backward (gradients complete)."""
    events: list[tuple[int, bool, int, int, float, float]] = field(default_factory=list)
    """With ``record``: (stage, is_backward, micro_batch, chunk, start_s, end_s) of every task."""


def run_pipeline(schedule: str, p: int, m: int, v: int, fwd_s: list[list[float]], bwd_s: list[list[float]],
                 p2p_s: float, *, record: bool = False) -> PipelineResult:
    """Simulate all m micro-batches; ``fwd_s[stage][chunk]`` and ``bwd_s`` are per-task durations."""
    orders = [stage_order(schedule, s, p, m, v) for s in range(p)]
    n_tasks = 2 * v * m * p
    finish = [-1.0] * n_tasks
    path_p2p = [0.0] * n_tasks
    free, last, ptr = [0.0] * p, [-1] * p, [0] * p
    last_bwd = [[0.0] * v for _ in range(p)]
    waiting: dict[int, int] = {}
    events: list = []
    stack = list(range(p - 1, -1, -1))

    # task id = ((is_backward * v + chunk) * m + micro_batch) * p + stage
    bwd_base = v * m * p
    while stack:
        s = stack.pop()
        order = orders[s]
        while ptr[s] < len(order):
            backward, mb, c = order[ptr[s]]
            here = (c * m + mb) * p + s
            if not backward:
                dep = here - 1 if s > 0 else (here - m * p + p - 1 if c > 0 else -1)
            else:
                here += bwd_base
                dep = here + 1 if s < p - 1 else (here + m * p - p + 1 if c < v - 1 else -1)
            if dep >= 0 and finish[dep] < 0:
                waiting[dep] = s
                break
            start = free[s]
            path = path_p2p[last[s]] if last[s] >= 0 else 0.0
            if dep >= 0 and finish[dep] + p2p_s > start:
                start, path = finish[dep] + p2p_s, path_p2p[dep] + p2p_s
            end = start + (bwd_s[s][c] if backward else fwd_s[s][c])
            me = here
            finish[me], path_p2p[me] = end, path
            free[s], last[s] = end, me
            ptr[s] += 1
            if backward and mb == m - 1:
                last_bwd[s][c] = end
            if record:
                events.append((s, backward, mb, c, start, end))
            if me in waiting:
                stack.append(waiting.pop(me))
    if any(ptr[s] < len(orders[s]) for s in range(p)):
        raise RuntimeError(f"pipeline schedule {schedule!r} deadlocked (p={p}, m={m}, v={v}); this is a bug")
    return PipelineResult(end_s=tuple(free), critical_p2p_s=tuple(path_p2p[t] for t in last),
                          last_backward_end_s=tuple(tuple(x) for x in last_bwd), events=events)


def _affine(a: float, b: float, c: float) -> bool:
    return math.isclose(c - b, b - a, rel_tol=1e-9, abs_tol=1e-12)


def simulate_pipeline(schedule: str, p: int, m: int, v: int, fwd_s: list[list[float]],
                      bwd_s: list[list[float]], p2p_s: float) -> PipelineResult:
    """Same result as ``run_pipeline`` for all m, using steady-state periodicity when m is large."""
    q, base = (p if schedule == "interleaved" else 1), 2 * p
    m0 = base + (m - base) % q
    if m <= m0 + 2 * q:
        return run_pipeline(schedule, p, m, v, fwd_s, bwd_s, p2p_s)
    runs = [run_pipeline(schedule, p, m0 + i * q, v, fwd_s, bwd_s, p2p_s) for i in range(3)]
    steps = (m - m0) // q

    def extrapolate(values: list[float]) -> float | None:
        a, b, c = values
        return a + steps * (b - a) if _affine(a, b, c) else None

    def series(get) -> list[float | None]:
        return [extrapolate([get(r)[i] for r in runs]) for i in range(len(get(runs[0])))]

    end = series(lambda r: r.end_s)
    p2p = series(lambda r: r.critical_p2p_s)
    last_bwd = [series(lambda r, s=s: r.last_backward_end_s[s]) for s in range(p)]
    flat = end + p2p + [x for row in last_bwd for x in row]
    if any(x is None for x in flat):
        return run_pipeline(schedule, p, m, v, fwd_s, bwd_s, p2p_s)
    return PipelineResult(end_s=tuple(end), critical_p2p_s=tuple(p2p),
                          last_backward_end_s=tuple(tuple(row) for row in last_bwd))


def stage_tail(*, parallel: ParallelConfig, dp: GroupPlacement, profile: ClusterProfile,
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
        if begin < compute_end_s:  # slowed while the compute runs, full speed after (changed with the model)
            slowed = duration * profile.comm_slowdown
            overlap += min(begin + slowed, compute_end_s) - begin
            comm_end = begin + slowed if begin + slowed <= compute_end_s else \
                compute_end_s + duration - (compute_end_s - begin) / profile.comm_slowdown
        else:
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
