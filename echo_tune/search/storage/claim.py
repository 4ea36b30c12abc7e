"""Many workers on one study: a cross-process lock around "count the trials, then ask for one", the
liveness of RUNNING trials, and workers that die with their parent (issue 10, concurrency).

Optuna's ``study.ask()`` is atomic, but "are there fewer than the target trials? then ask" is not: several
workers pass the check together and overshoot. ``claim(store)`` makes it one step:

* our journal file: its ``flock`` (the batch lock, re-entrant);
* SQLite: ``flock`` on ``<database>.flock`` beside the database file (local files only, as SQLite itself);
* PostgreSQL: a session advisory lock (``pg_advisory_lock``) keyed by the study storage, held on its own
  connection for the claim (https://www.postgresql.org/docs/current/functions-admin.html);
* other URLs (MySQL, Redis): no lock; the target can be overshot by up to the number of workers.

A trial is stamped with its worker (``host:pid``) when asked, so a RUNNING trial counts toward the target
only while its worker lives: a killed run's leftovers do not block a resumed study, and a live worker's
trial is never taken for a leftover by a worker started a moment later.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
import signal
from optuna.trial import TrialState

WORKER_ATTR = "worker"
HEARTBEAT_S = 5.0
"""How often a live worker's heartbeat counter is raised (liveness.py, tickets.py)."""
_HOST = socket.gethostname()


def worker_id() -> str:
    return f"{_HOST}:{os.getpid()}"


def worker_alive(worker: str | None) -> bool:
    """Whether the worker that asked a RUNNING trial still runs (another host's workers: assumed alive)."""
    if not worker:
        return False  # stamped by no live worker of this version: a leftover of a killed run
    host, _, pid = worker.rpartition(":")
    if host != _HOST:
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return not _zombie(int(pid))


def _zombie(pid: int) -> bool:
    """A process that has exited but was not reaped (in a container whose init does not reap orphans, a
    SIGKILLed search's worker stays so): dead, though ``kill(pid, 0)`` finds it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return False


_alive = worker_alive


def same_host(worker: str | None) -> bool:
    """Whether ``worker`` (``host:pid``) ran on this host, where ``worker_alive`` is exact."""
    return bool(worker) and worker.rpartition(":")[0] == _HOST


def started_count(study, finished_states: tuple) -> int:
    """Trials finished, or running in a live worker: what counts toward the study's target."""
    count = 0
    for t in study.get_trials(deepcopy=False, states=finished_states + (TrialState.RUNNING,)):
        if t.state != TrialState.RUNNING or _alive(t.user_attrs.get(WORKER_ATTR)):
            count += 1
    return count


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextlib.contextmanager
def claim(store) -> Iterator[None]:
    """Hold the storage's cross-process lock (see the module docstring); writes inside are one batch."""
    url = store.where
    if store.journal is not None:
        with store.batch():
            yield
        return
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:":
            with file_lock(str(Path(path)) + ".flock"):
                yield
            return
    if url.startswith("postgresql"):
        # lazy: loads sqlalchemy (~0.4 s), which importing search.claim does not
        from sqlalchemy import text

        key = zlib.crc32(f"echo-tune:{url}".encode()) & 0x7FFFFFFF
        with store.storage.engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                conn.commit()
        return
    yield


_STOP = threading.Event()


def stop_requested() -> bool:
    """In a sampling worker: SIGTERM or SIGINT arrived; finish the trial in hand and return (issue 20)."""
    return _STOP.is_set()


def die_with_parent(parent: int | None = None, poll_s: float = 0.5, signals: str = "ignore") -> None:
    """In a worker process: exit as soon as the parent is gone (SIGKILLed parents run no clean-up).

    ``parent``: the pid of the process that started this one, passed from there (the parent may have
    died before this runs, and then ``os.getppid()`` already names the reaper).

    ``signals``: what SIGTERM and SIGINT do here. A scheduler's SIGTERM (or Ctrl-C) goes to the whole
    process group; a worker killed by it loses its batch and breaks the pool (loky's
    TerminatedWorkerError). So an exhaustive worker ``"ignore"``s them (the parent stops after the batch
    in hand, its workers' batches are short), and a sampling worker ``"stop"``s: ``stop_requested()``
    turns true and its loop returns after the trial in hand is stored (issue 20)."""
    if threading.current_thread() is threading.main_thread():
        handler = signal.SIG_IGN if signals == "ignore" else (lambda signum, frame: _STOP.set())
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, handler)
    parent = os.getppid() if parent is None else parent
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(poll_s)
    threading.Thread(target=watch, name="echo-tune-parent-watch", daemon=True).start()


@contextlib.contextmanager
def beating(write, *, at_once: bool = False) -> Iterator[None]:
    """Call ``write(n)`` with a rising counter every ``HEARTBEAT_S`` on a daemon thread while the block runs (the
    first at once with ``at_once``); a write that raises ends the beat (the storage is gone, or the beat's subject
    was taken over), the search's own writes saying what happened."""
    done = threading.Event()

    def beat() -> None:
        n = 0 if at_once else 1
        if not at_once and done.wait(HEARTBEAT_S):
            return
        while True:
            try:
                write(n)
            except Exception:  # noqa: BLE001 - see the docstring
                return
            n += 1
            if done.wait(HEARTBEAT_S):
                return
    thread = threading.Thread(target=beat, name="echo-tune-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=HEARTBEAT_S)
