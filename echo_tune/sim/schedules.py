"""Pipeline schedules: the order in which each stage runs its forward and backward passes.

A task is ``(is_backward, micro_batch, chunk)``. Orders follow Megatron-LM's
``megatron/core/pipeline_parallel/schedules.py``:

- ``none``: no pipelining, forward then backward per micro-batch.
- ``gpipe``: all forwards, then all backwards (not in Megatron; kept for comparison).
- ``1f1b``: ``min(p - s - 1, m)`` warm-up forwards, then one-forward-one-backward, then cool-down.
- ``interleaved``: v model chunks per stage; micro-batches go in groups of p through each chunk;
  warm-up ``(p - s - 1) * 2 + (v - 1) * p`` forwards (all of them when m == p).
"""

from __future__ import annotations

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
        warmup = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)
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
