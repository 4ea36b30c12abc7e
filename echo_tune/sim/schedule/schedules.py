"""Pipeline schedules: the order in which each stage runs its forward and backward passes.

A task is ``(is_backward, micro_batch, chunk)``. Orders follow Megatron-LM's
``megatron/core/pipeline_parallel/schedules.py``:

- ``none``: no pipelining, forward then backward per micro-batch.
- ``gpipe``: all forwards, then all backwards (not in Megatron; kept for comparison).
- ``1f1b``: ``min(p - s - 1, m)`` warm-up forwards, then one-forward-one-backward, then cool-down.
- ``interleaved``: v model chunks per stage; micro-batches go in groups of p (or
  ``--microbatch-group-size-per-virtual-pipeline-stage``, N) through each chunk; warm-up
  ``(p - s - 1) * 2 + (v - 1) * N`` forwards, at most all of them (d98e8a64ddf3 ``get_pp_rank_microbatches``;
  older Megatron-LM ran every forward first whenever m == p, the reference commit does not).
"""

from __future__ import annotations

import functools

from echo_tune.identity_cache import IdentityCache

SCHEDULES = ("none", "gpipe", "1f1b", "interleaved")

Task = tuple[bool, int, int]


def _schedule_table(m: int, v: int, group: int) -> tuple[tuple[int, int], ...]:
    """(micro-batch, chunk) of each virtual micro-batch: groups of ``group`` micro-batches go through every
    chunk in turn; the last group takes what is left (schedules.py ``get_schedule_table``)."""
    table = []
    for first in range(0, m, group):
        last = m if first + group >= m else first + group
        table += [(mb, chunk) for chunk in range(v) for mb in range(first, last)]
    return tuple(table)


@functools.lru_cache(maxsize=4096)
def stage_order(schedule: str, stage: int, p: int, m: int, v: int = 1, group: int | None = None) -> tuple[Task, ...]:
    """The task order of one pipeline stage (cached: the same structure recurs across layouts).

    ``group``: the interleaved schedule's ``--microbatch-group-size-per-virtual-pipeline-stage`` (None = p)."""
    return tuple(_stage_order(schedule, stage, p, m, v, group or p))


def _stage_order(schedule: str, stage: int, p: int, m: int, v: int, group: int) -> list[Task]:
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
        # schedules.py get_pp_rank_microbatches: (p - s - 1) * 2 + (v - 1) * group warm-up forwards
        warmup = min((p - stage - 1) * 2 + (v - 1) * group, total)
        table = _schedule_table(m, v, group)
        fwd = [(False, mb, c) for mb, c in table]
        bwd = [(True, mb, v - 1 - c) for mb, c in table]  # backward runs the chunks in reverse
        order = fwd[:warmup]
        for k in range(total - warmup):
            order += [fwd[k + warmup], bwd[k]]
        return order + bwd[total - warmup:]
    raise ValueError(f"unknown schedule {schedule!r}; expected one of {SCHEDULES}")


def peak_in_flight(order: tuple[Task, ...], v: int) -> list[int]:
    """Most forward passes of each chunk whose backward has not run yet (activations held)."""
    live, peak = [0] * v, [0] * v
    for backward, _, chunk in order:
        live[chunk] += -1 if backward else 1
        peak[chunk] = max(peak[chunk], live[chunk])
    return peak


def peak_in_flight_total(order: tuple[Task, ...], chunk_bytes: list[float]) -> float:
    """Peak bytes of activations held, weighting each chunk's live micro-batches by its bytes."""
    live = peak = 0.0
    for backward, _, chunk in order:
        live += -chunk_bytes[chunk] if backward else chunk_bytes[chunk]
        peak = max(peak, live)
    return peak


def _state_order(schedule: str, stage: int, p: int, m: int, v: int, group: int | None) -> tuple[Task, ...] | None:
    """The tasks whose live states are every state of the stage's order (None: GPipe, in closed form).

    The warm-up of 1F1B and interleaving holds at most 2pv forwards; after it the live set cycles with
    period pv tasks, so the first 4pv + 2 tasks show every state."""
    if schedule == "interleaved" and group not in (None, p):
        # another group size: warm-up, period and the last group's size differ; walk the whole order
        return stage_order(schedule, stage, p, m, v, group)
    if schedule in ("1f1b", "interleaved"):
        # the first 4pv + 2 tasks are the same for every m > 4p + 2 (same warm-up, then steady pairs)
        return stage_order(schedule, stage, p, min(m, 4 * p + 3), v)[:4 * p * v + 2]
    if schedule == "none":
        # forward then backward per micro-batch: the live set only ever holds one, for any m
        return stage_order(schedule, stage, p, min(m, 2), v)
    if schedule == "gpipe":
        # all forwards before any backward (building the order would cost memory linear in m: issue 10)
        return None
    return stage_order(schedule, stage, p, m, v)


@functools.lru_cache(maxsize=4096)
def live_count_vectors(schedule: str, stage: int, p: int, m: int, v: int,
                       group: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Every distinct number of live micro-batches per chunk after a task of the stage's order.

    Vectors dominated by another one are dropped: bytes per chunk are >= 0, so they can never hold the peak.
    """
    order = _state_order(schedule, stage, p, m, v, group)
    if order is None:  # GPipe: the peak is every micro-batch of chunk 0, in closed form
        return ((m,) + (0,) * (v - 1),)
    live, seen = [0] * v, set()
    for backward, _, chunk in order:
        live[chunk] += -1 if backward else 1
        seen.add(tuple(live))
    if v == 1:
        return (max(seen),)
    kept: list[tuple[int, ...]] = []
    for a in sorted(seen, key=lambda x: (-sum(x), x)):  # a dominator sorts before what it dominates
        if not any(all(x >= y for x, y in zip(b, a)) for b in kept):
            kept.append(a)
    return tuple(sorted(kept))


_PEAKS = IdentityCache(limit=8192)  # peak_in_flight_bytes by every argument


def peak_in_flight_bytes(schedule: str, stage: int, p: int, m: int, v: int, chunk_bytes: list[float],
                         group: int | None = None) -> float:
    """``peak_in_flight_total`` of the stage's order from the cached live-count vectors.

    Equal to the task-by-task sum (exactly, for integral byte counts below 2**53). Remembered by every
    argument (the bytes as exact numbers): a search's layouts that differ only in settings that change no
    activation (the dispatcher, the EP overlap, the FP8 recipe's timing) meet the same sums again.
    """
    key = (schedule, stage, p, m, v, group, tuple(chunk_bytes))
    return _PEAKS.get((), key, lambda: _peak_in_flight(schedule, stage, p, m, v, chunk_bytes, group))


def _peak_in_flight(schedule: str, stage: int, p: int, m: int, v: int, chunk_bytes: list[float],
                    group: int | None) -> float:
    peak = 0.0
    for counts in live_count_vectors(schedule, stage, p, m, v, group):
        total = 0.0
        for n, nbytes in zip(counts, chunk_bytes):
            total += n * nbytes
        peak = max(peak, total)
    return peak


@functools.lru_cache(maxsize=4096)
def after_forward_vectors(schedule: str, stage: int, p: int, m: int, v: int, chunk: int,
                          group: int | None = None) -> tuple[tuple[int, ...], ...]:
    """Live micro-batches per chunk right after each forward of ``chunk`` (where the last stage computes
    the loss, on its last chunk): the states the loss's working set is added to."""
    order = _state_order(schedule, stage, p, m, v, group)
    if order is None:
        return live_count_vectors(schedule, stage, p, m, v, group)
    live, seen = [0] * v, set()
    for backward, _, c in order:
        live[c] += -1 if backward else 1
        if not backward and c == chunk:
            seen.add(tuple(live))
    return tuple(sorted(seen))


def after_forward_peak_bytes(schedule: str, stage: int, p: int, m: int, v: int, chunk: int,
                             chunk_bytes: list[float], group: int | None = None) -> float:
    """Most activation bytes held right after a forward of ``chunk``."""
    return max((sum(n * b for n, b in zip(counts, chunk_bytes))
                for counts in after_forward_vectors(schedule, stage, p, m, v, chunk, group)), default=0.0)
