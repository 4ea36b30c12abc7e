"""The worker processes of a search with several processes, and ``dispatch``, which shares parts out to them.

loky (joblib's process pool) runs them: a worker starts clean (no torch, no inherited threads), imports only
the simulator, needs no ``if __name__ == "__main__"`` guard in the caller, and is reused by the next search of
the process (started early by ``start_workers``; ended by ``stop_workers`` or after 60 s idle).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

from echo_tune.plots import available, load_pyplot
from echo_tune.search.storage.claim import die_with_parent
from echo_tune.search.engines.gc_pause import mark_worker, run_ends, task_begins, task_ends
import echo_tune.sim.simulate

SWITCH_INTERVAL_S = 0.001  # Python's thread switch interval while workers run (``dispatch``)

_POOLS: list = []  # the pool worker_pool last returned (loky keeps one reusable pool per process)


def worker_pool(n_jobs: int):
    """The (reusable) pool of ``n_jobs - 1`` worker processes."""
    # lazy: loads joblib (~0.3 s), which importing search.workers does not
    from joblib.externals.loky import get_reusable_executor

    pool = get_reusable_executor(max_workers=n_jobs - 1, timeout=60, initializer=_init_worker,
                                 initargs=(os.getpid(),))
    _POOLS[:] = [pool]
    return pool


def stop_workers() -> None:
    """End the worker processes now, without waiting for each to free its heap (the `echo-tune` command does
    this as it exits; a notebook keeps them for its next search, and loky ends them after 60 s idle). At
    interpreter exit loky instead sends each worker a sentinel and joins it: a worker then tears down the
    simulator's caches object by object, 0.6-0.7 s after a Qwen3-30B-A3B search. They hold nothing to save:
    every result has been returned. The pool's manager thread is waited for (15-22 ms with the workers killed):
    not waited for, the process could exit before it released the pool's queue locks, and loky's resource
    tracker then printed "leaked semlock objects" warnings after the command's last line (seen once in CI,
    after a SIGTERM to the process group, tests/cli/test_sigterm.py)."""
    for pool in _POOLS:
        pool.shutdown(wait=True, kill_workers=True)
    _POOLS.clear()


def _init_worker(parent: int) -> None:
    mark_worker()
    die_with_parent(parent)  # a SIGKILLed search must not leave its workers behind (issue 10)
    # a worker traces a shape the trace cache misses (sliced.py) with one thread: the cores are the search's
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _ready() -> None:
    """A worker's first task: load the simulator (what the first batch would, about a second)."""

def _load_plotting() -> None:
    """A worker loads matplotlib (~1 s) while three quarters of the run's parts are handed out: it draws the
    search's plot (``summarize``) after the run. Loaded once the last part was handed out, it was the run's
    tail: this process waited ~1 s for the plot once trials.csv no longer took as long."""
    if available():
        load_pyplot()


def _ready_to_plot() -> None:
    """A worker out of batches: what it froze during the run collectable again (``gc_pause.run_ends``)."""
    run_ends()


def start_workers(n_jobs: int) -> None:
    """Start ``run_exhaustive``'s worker processes now, so their start-up (a process and the simulator's
    imports) runs while this process enumerates the layouts and opens the study, not during the run."""
    if n_jobs > 1:
        pool = worker_pool(n_jobs)
        for _ in range(n_jobs - 1):
            pool.submit(_ready)


class _RunPool:
    """The worker pool as ``dispatch``'s callers see it: each task runs between ``task_begins(run)`` and
    ``task_ends()`` in the worker (gc_pause.py)."""

    def __init__(self, pool, run: object):
        self._pool, self._run = pool, run

    def submit(self, fn, *args) -> Future:
        return self._pool.submit(_task_in_worker, self._run, fn, *args)


def _task_in_worker(run: object, fn, *args):
    task_begins(run)
    try:
        return fn(*args)
    finally:
        task_ends()


def dispatch(n_parts: int, n_jobs: int, submit: Callable[[object, int], Future],
             here: Callable[[int, Callable[[], None]], object]) -> Iterator:
    """The results of parts ``0 .. n_parts - 1`` in order, run by ``n_jobs - 1`` worker processes
    (``submit(pool, i)``) and this one (``here(i, feed)``, calling ``feed`` now and then): the workers take
    parts in order, this process takes the next one whenever the part to yield next is not done yet.

    loky (joblib's process pool): a worker starts clean (no torch, no inherited threads), imports only the
    simulator, needs no ``if __name__ == "__main__"`` guard in the caller, and is reused by the next search
    (and started early by ``start_workers``). Closing the generator cancels the parts not started."""
    pool = worker_pool(n_jobs)
    runs = _RunPool(pool, (os.getpid(), time.monotonic_ns()))  # one id per run: what a worker froze is per run
    # loky's threads here pass the workers their results and next parts: with Python's 5 ms switch interval
    # each hand-over waited on this thread's simulating (a worker idle 1.9 s against 1.4 s at 1 ms, Qwen3-30B-A3B)
    switch_s = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_s, SWITCH_INTERVAL_S))
    futures: dict[int, Future] = {}  # parts handed to the workers
    mine: dict[int, object] = {}  # parts run here, waiting to be yielded in order
    handed = [0]  # every part before this one is a worker's or ours
    plotting: list[Future] = []

    def feed() -> None:  # keep eight parts queued per worker (it never waits on this process), in order
        while sum(not f.done() for f in futures.values()) < 8 * (n_jobs - 1) and handed[0] < n_parts:
            futures[handed[0]] = submit(runs, handed[0])
            handed[0] += 1
        if 4 * handed[0] >= 3 * n_parts and not plotting:  # between parts, so it never delays the run's end
            plotting.append(pool.submit(_load_plotting))
        if handed[0] >= n_parts and len(plotting) == 1:  # every part handed out
            plotting.append(pool.submit(_ready_to_plot))

    def run_here(i: int) -> None:
        mine[i] = here(i, feed)

    try:
        # in order, so trials are numbered as with one process, and stored as soon as the parts before
        # them are: while the next one is still a worker's, this process runs the next part nobody has taken
        for i in range(n_parts):
            feed()
            while i not in mine and not (i in futures and futures[i].done()):
                if handed[0] < n_parts:
                    handed[0] += 1
                    run_here(handed[0] - 1)
                elif futures[i].cancel():  # queued for a worker that has not started it: do it here
                    del futures[i]
                    run_here(i)
                else:
                    futures[i].result()  # running: wait for it
            done = mine.pop(i) if i in mine else futures.pop(i).result()
            feed()
            yield done
    finally:
        sys.setswitchinterval(switch_s)
        for f in futures.values():
            f.cancel()
