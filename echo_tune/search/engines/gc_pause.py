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
def gc_paused(*, freeze_after: bool = False) -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-enabled after it, if it was on).

    ``freeze_after``: what the block made is frozen (``gc.freeze``) before the collector is on again, so its
    next pass does not scan it. Only for a process that ends soon after (the ``echo-tune`` command: frozen
    objects are still freed by reference counting, but a cycle among them would never be collected). After a
    Qwen3-30B-A3B exhaustive search that first pass took 0.7-1.2 s (``gc.callbacks``)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze_after:
            gc.freeze()
        if was_enabled:
            gc.enable()


_WORKER: dict = {"in_worker": False, "run": None}


def mark_worker() -> None:
    """Called in an exhaustive search's worker process when it starts (``workers._init_worker``)."""
    _WORKER["in_worker"] = True


def task_begins(run: object) -> None:
    """In a worker, before a task of the search run ``run`` (``workers.dispatch``): the collector off for the
    task, and what the worker holds so far (the simulator's caches, earlier tasks' results) frozen. Without
    psutil, loky calls ``gc.collect()`` after a task at most once a second (loky/process_executor.py), which
    scanned those caches: 0.8-1.1 s of a worker's 10.8 s in a Qwen3-30B-A3B run (gc.callbacks), the worker idle
    meanwhile; frozen, only the objects made since are scanned. The first task of a new run unfreezes and
    collects what the last run froze (a run cut short never told this worker it ended)."""
    if not _WORKER["in_worker"]:
        return
    if _WORKER["run"] != run:
        gc.unfreeze()
        gc.collect()
        _WORKER["run"] = run
    gc.disable()
    gc.freeze()


def task_ends() -> None:
    """In a worker, after a task: the collector back on (it scans what is not frozen)."""
    if _WORKER["in_worker"]:
        gc.enable()


def run_ends() -> None:
    """In a worker, when the run's tasks are all handed out: everything frozen collectable again."""
    if _WORKER["in_worker"]:
        gc.unfreeze()
        gc.enable()
        _WORKER["run"] = None
