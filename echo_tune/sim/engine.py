"""Event-driven, deterministic simulation of one pipeline (DP replicas are symmetric).

Each stage runs its tasks in its schedule order on one compute stream. A forward pass waits for the
previous stage's forward of the same micro-batch and chunk (plus the p2p transfer); a backward pass
waits for the next stage's backward. Tasks are released in dependency order (a worklist: each stage
blocks on at most one missing dependency), so the cost is linear in the number of tasks.

Long runs are periodic: once the warm-up transient is over, adding q micro-batches adds a
constant time (q = p for interleaving, else 1). ``simulate_pipeline`` simulates three short runs
(from 2p micro-batches on), checks that they are exactly affine in m, and extrapolates; if they are
not, it simulates all m micro-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from echo_tune.sim.schedules import stage_order


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
