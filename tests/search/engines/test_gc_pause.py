"""The collector paused around a search, frozen after it where the process exits next, and the workers ended
without waiting for them to free their heaps (gc_pause.py, workers.stop_workers)."""

from __future__ import annotations

import gc
import os
import time

from echo_tune.search.engines.workers import stop_workers, worker_pool
from echo_tune.search.engines.gc_pause import gc_paused


def test_a_paused_block_leaves_the_collector_as_it_found_it():
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not turn it on inside the outer one
    assert gc.isenabled()


def test_freeze_after_freezes_what_the_block_made_and_turns_the_collector_back_on():
    before = gc.get_freeze_count()
    try:
        with gc_paused(freeze_after=True):
            made = [[i] for i in range(1000)]  # tracked containers
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(made)
    finally:
        gc.unfreeze()
    with gc_paused():
        pass
    assert gc.get_freeze_count() == 0  # without it, nothing is frozen


def _pid() -> int:
    time.sleep(0.2)
    return os.getpid()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (ended, not reaped yet) counts as ended
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stop_workers_ends_the_pool_and_a_later_search_gets_a_new_one():
    pool = worker_pool(2)
    pid = pool.submit(_pid).result()
    assert _alive(pid)
    stop_workers()
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    assert worker_pool(2).submit(_pid).result() != pid  # a fresh worker
    stop_workers()
    stop_workers()  # nothing left: a no-op
