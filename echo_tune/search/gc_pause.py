"""Python's cyclic garbage collector paused while a search builds and stores its long-lived objects.

An exhaustive search holds every layout of its space (43,194 on Qwen3-30B-A3B / 256 H100), and Optuna's
storage every finished trial, for the whole run: hundreds of thousands of objects that live to the end. A
full collection scans all of them (up to ~1 s each there, several per run), finds nearly nothing to free
(peak memory of that run 916 MB with the collector, 919 MB without) and, in the parent of a parallel
search, leaves the workers without batches while it runs. Reference counting still frees everything that
is not in a cycle; the collector is enabled again when the block ends. Measured in docs/search.md.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-enabled after it, if it was on)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


_IN_WORKER = [False]


def mark_worker() -> None:
    """Called in an exhaustive search's worker process when it starts (``exhaustive._init_worker``)."""
    _IN_WORKER[0] = True


def pause_in_worker() -> None:
    """In a worker, before each batch: the collector off until the run ends (``resume_in_worker``), and what
    the worker holds so far (the simulator's caches, earlier batches' leftovers) frozen: without psutil, loky
    calls ``gc.collect()`` after a task at most once a second (loky/process_executor.py), which scanned those
    caches: 0.8-1.1 s of a worker's 10.8 s in a Qwen3-30B-A3B run (gc.callbacks), the worker idle
    meanwhile. Frozen, only the objects of the batch since are scanned. The parent pauses for its whole run
    too (``run_exhaustive``)."""
    if _IN_WORKER[0]:
        gc.disable()
        gc.freeze()


def resume_in_worker() -> None:
    """In a worker, when the run's batches are all handed out: the collector back on, everything frozen
    collectable again."""
    if _IN_WORKER[0]:
        gc.unfreeze()
        gc.enable()
