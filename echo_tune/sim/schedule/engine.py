"""Event-driven, deterministic simulation of one pipeline (DP replicas are symmetric).

Each stage runs its tasks in its schedule order on one compute stream. A forward pass waits for the
previous stage's forward of the same micro-batch and chunk (plus the p2p transfer); a backward pass
waits for the next stage's backward.

The dependency structure depends only on (schedule, p, m, v), which recurs across many layouts, so it
is compiled once into a *program* (cached): the tasks in a dependency order, each as (index of the
previous task on its stage, index of its cross-stage dependency, index of its duration). Running a
program is one tight loop doing the same floating-point operations as the event loop would, so the
times are bit-for-bit those of a task-by-task simulation.

Long runs are periodic: once the warm-up transient is over, adding q micro-batches adds a
constant time (q = p for interleaving, else 1). ``simulate_pipeline`` simulates three short runs
(from 2p micro-batches on), checks that they are exactly affine in m, and extrapolates; if they are
not, it simulates all m micro-batches. The three runs are compiled into one program: a task of a
shorter run whose whole dependency cone is the same as in the longest run shares its value.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

from echo_tune.errors import ConfigError
from echo_tune.identity_cache import IdentityCache
from echo_tune.limits import MAX_SIMULATED_MICRO_BATCHES
from echo_tune.sim.schedule.schedules import stage_order

# Program slots 0 and 1 are sentinels: slot 0 holds 0.0 (a stage's start), slot 1 holds -inf (no
# dependency: -inf + p2p never wins); tasks are slots 2, 3, ...
_START, _NONE, _FIRST = 0, 1, 2


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
    transfers: list[tuple[int, int, bool, int, int, float, float]] = field(default_factory=list)
    """With ``record``: (from_stage, to_stage, is_backward, micro_batch, chunk, start_s, end_s) of every p2p
    transfer a task waits on (the sender's pass ends at start_s, the receiver may start at end_s)."""
    critical_transfers: tuple[tuple[int, ...], ...] = ()
    """With ``record``: per stage, the indices into ``transfers`` on the critical path that ends at its last
    task, in time order (their durations add up to ``critical_p2p_s`` of the stage)."""


Key = tuple[int, bool, int, int]  # (stage, is_backward, micro_batch, chunk)


@dataclass(frozen=True)
class _Outputs:
    """Slots of one run's results: last task per stage, last micro-batch's backward per stage and chunk."""
    last: tuple[int, ...]
    last_backward: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class _Program:
    prev: tuple[int, ...]
    dep: tuple[int, ...]
    duration: tuple[int, ...]  # index into [fwd of (s, c) ..., bwd of (s, c) ...], (s * v + c) (+ p * v)
    keys: tuple[Key, ...]
    runs: tuple[_Outputs, ...]


class _Builder:
    def __init__(self, p: int, v: int, group: int | None = None):
        self.p, self.v, self.group = p, v, group
        self.prev: list[int] = []
        self.dep: list[int] = []
        self.duration: list[int] = []
        self.keys: list[Key] = []

    def add_run(self, schedule: str, m: int, m_max: int, shared: dict[tuple, int] | None = None) -> _Outputs:
        """Append one run of m micro-batches, releasing tasks in dependency order (a worklist: each stage
        blocks on at most one missing dependency).

        A task whose (task, predecessor slot, dependency slot) is in ``shared`` reuses that slot: its whole
        dependency cone is the same as in an earlier run, so is its time. ``shared`` gains this run's tasks.
        """
        p, v = self.p, self.v
        prev, deps, duration, keys = self.prev, self.dep, self.duration, self.keys
        orders = [stage_order(schedule, s, p, m, v, self.group) for s in range(p)]
        # task id = ((is_backward * v + chunk) * m + micro_batch) * p + stage
        bwd_base = v * m * p
        slot = [-1] * (2 * bwd_base)
        last, ptr = [_START] * p, [0] * p
        waiting: dict[int, int] = {}
        stack = list(range(p - 1, -1, -1))
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
                d = _NONE
                if dep >= 0:
                    d = slot[dep]
                    if d < 0:
                        waiting[dep] = s
                        break
                a = last[s]
                sig = ((((v if backward else 0) + c) * m_max + mb) * p + s, a, d)
                i = shared.get(sig) if shared is not None else None
                if i is None:
                    i = _FIRST + len(prev)
                    prev.append(a)
                    deps.append(d)
                    duration.append((p * v if backward else 0) + s * v + c)
                    keys.append((s, backward, mb, c))
                    if shared is not None:
                        shared[sig] = i
                slot[here] = last[s] = i
                ptr[s] += 1
                if here in waiting:
                    stack.append(waiting.pop(here))
        if any(ptr[s] < len(orders[s]) for s in range(p)):
            raise RuntimeError(f"pipeline schedule {schedule!r} deadlocked (p={p}, m={m}, v={v}); this is a bug")
        last_backward = tuple(tuple(slot[((v + c) * m + m - 1) * p + s] for c in range(v)) for s in range(p))
        return _Outputs(tuple(last), last_backward)

    def build(self, runs: list[_Outputs]) -> _Program:
        return _Program(tuple(self.prev), tuple(self.dep), tuple(self.duration), tuple(self.keys), tuple(runs))


@functools.lru_cache(maxsize=256)  # a search meets ~80 pipeline structures
def _program(schedule: str, p: int, v: int, ms: tuple[int, ...], group: int | None = None) -> _Program:
    """One program for runs of each m in ``ms`` (longest first: shorter runs share its tasks)."""
    builder = _Builder(p, v, group)
    shared: dict[tuple, int] = {}
    runs = [builder.add_run(schedule, m, max(ms), shared) for m in ms]
    return builder.build(runs)


def _execute(program: _Program, fwd_s, bwd_s, p2p_s: float) -> tuple[list[float], list[float]]:
    """(finish, critical-path p2p) of every slot."""
    durations = [t for row in fwd_s for t in row] + [t for row in bwd_s for t in row]
    finish, path = [0.0, -math.inf], [0.0, 0.0]
    append_finish, append_path = finish.append, path.append
    for a, d, k in zip(program.prev, program.dep, program.duration):
        start = finish[a]
        after = finish[d] + p2p_s
        if after > start:
            append_finish(after + durations[k])
            append_path(path[d] + p2p_s)
        else:
            append_finish(start + durations[k])
            append_path(path[a])
    return finish, path


def _result(out: _Outputs, finish: list[float], path: list[float]) -> PipelineResult:
    return PipelineResult(end_s=tuple(finish[i] for i in out.last), critical_p2p_s=tuple(path[i] for i in out.last),
                          last_backward_end_s=tuple(tuple(finish[i] for i in row) for row in out.last_backward))


def run_pipeline(schedule: str, p: int, m: int, v: int, fwd_s: list[list[float]], bwd_s: list[list[float]],
                 p2p_s: float, *, record: bool = False, group: int | None = None) -> PipelineResult:
    """Simulate all m micro-batches; ``fwd_s[stage][chunk]`` and ``bwd_s`` are per-task durations.
    ``group``: the interleaved schedule's micro-batch group size (None = p)."""
    program = _program(schedule, p, v, (m,), group)
    finish, path = _execute(program, fwd_s, bwd_s, p2p_s)
    result = _result(program.runs[0], finish, path)
    if record:
        result = _recorded(program, finish, result, p, p2p_s)
    return result


def _recorded(program: _Program, finish: list[float], result: PipelineResult, p: int,
              p2p_s: float) -> PipelineResult:
    """``result`` with every task's span, every transfer, and each stage's critical-path transfers. A task
    waits on its transfer when that arrives after its stage's previous task ends (as in ``_execute``)."""
    events, transfers, arrival = [], [], {}
    for i, (s, backward, mb, c) in enumerate(program.keys):
        a, d = program.prev[i], program.dep[i]
        start = finish[a]
        if d != _NONE:
            arrival[_FIRST + i] = len(transfers)
            transfers.append((program.keys[d - _FIRST][0], s, backward, mb, c, finish[d], finish[d] + p2p_s))
            if finish[d] + p2p_s > start:
                start = finish[d] + p2p_s
        events.append((s, backward, mb, c, start, finish[_FIRST + i]))
    critical = []
    for s in range(p):  # walk back from the stage's last task along whichever input bound each start
        path, i = [], program.runs[0].last[s]
        while i >= _FIRST:
            a, d = program.prev[i - _FIRST], program.dep[i - _FIRST]
            if finish[d] + p2p_s > finish[a]:
                path.append(arrival[i])
                i = d
            else:
                i = a
        critical.append(tuple(reversed(path)))
    return dataclasses.replace(result, events=events, transfers=transfers, critical_transfers=tuple(critical))


def _affine(a: float, b: float, c: float) -> bool:
    return math.isclose(c - b, b - a, rel_tol=1e-9, abs_tol=1e-12)


_RESULTS = IdentityCache(limit=4096)  # simulate_pipeline by every argument


def simulate_pipeline(schedule: str, p: int, m: int, v: int, fwd_s: list[list[float]],
                      bwd_s: list[list[float]], p2p_s: float, group: int | None = None) -> PipelineResult:
    """Same result as ``run_pipeline`` for all m, using steady-state periodicity when m is large (the
    interleaved schedule repeats every ``group`` micro-batches, p by default).

    Remembered by every argument (the durations as exact floats): a search meets the same pipeline again
    in layouts whose settings change memory but not the passes' times (a third of the calls on the
    Qwen3-235B-A22B recipe space). The result is immutable (tuples), so the copy returned is shared."""
    key = (schedule, p, m, v, group, p2p_s, tuple(map(tuple, fwd_s)), tuple(map(tuple, bwd_s)))
    return _RESULTS.get((), key, lambda: _simulate_pipeline(schedule, p, m, v, fwd_s, bwd_s, p2p_s, group))


def _simulate_pipeline(schedule: str, p: int, m: int, v: int, fwd_s: list[list[float]],
                       bwd_s: list[list[float]], p2p_s: float, group: int | None) -> PipelineResult:
    q = (group or p) if schedule == "interleaved" else 1
    base = 2 * max(p, q)
    m0 = base + (m - base) % q
    if m <= m0 + 2 * q:
        return run_pipeline(schedule, p, m, v, fwd_s, bwd_s, p2p_s, group=group)
    program = _program(schedule, p, v, (m0 + 2 * q, m0 + q, m0), group)
    finish, path = _execute(program, fwd_s, bwd_s, p2p_s)
    runs = [_result(out, finish, path) for out in reversed(program.runs)]
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
        if m > MAX_SIMULATED_MICRO_BATCHES:  # simulating every task would grow memory with m (issue 10)
            raise ConfigError(f"the {schedule} pipeline (p={p}, v={v}) is not periodic enough to extrapolate, and "
                              f"simulating all {m} micro-batches task by task is refused above "
                              f"{MAX_SIMULATED_MICRO_BATCHES}; lower --global-batch-size or raise --micro-batch-size")
        return run_pipeline(schedule, p, m, v, fwd_s, bwd_s, p2p_s, group=group)
    return PipelineResult(end_s=tuple(end), critical_p2p_s=tuple(p2p),
                          last_backward_end_s=tuple(tuple(row) for row in last_bwd))
