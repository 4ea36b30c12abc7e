"""One run at a time of the searches that do not share out their work (issue 41 item 2).

The exhaustive search on a journal (or Redis) and the default ``auto`` search compute what to run from the
trials stored when they start. Two of them started on one study both ran (and stored) the same layouts. So
such a run first takes the study's *run lease*; a second run waits for the first to end, then continues the
study with what is left (often nothing), and every layout is stored once:

* a journal file: a POSIX record lock (``lockf``) on ``<journal>.run``, one byte per study name, which the
  kernel drops when the process dies (a SIGKILLed run never leaves a stale lease);
* SQLite: the same on ``<database>.run``;
* PostgreSQL: a session advisory lock (``pg_try_advisory_lock``) on a connection held for the run, which the
  server drops with the connection;
* other storages: none (the docs say to share a study there with ``tpe`` or ``exhaustive`` on a database).

The sampling searches (``tpe``, ``random``, ``nsga2``) and the exhaustive search on a database share a
study between workers through claims instead (``claim.py``, ``tickets.py``) and take no lease.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import sys
import time
import zlib
from collections.abc import Iterator

from echo_tune.search.storage.storage_checks import open_nofollow

LEASE_SUFFIX = ".run"
POLL_S = 0.2


def lease_path(store) -> str | None:
    """The file whose byte locks are the leases of ``store``'s studies (None: not a local file storage)."""
    if store.journal is not None:
        return os.path.realpath(store.journal.path) + LEASE_SUFFIX
    url = store.where
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if path and path != ":memory:" and not path.startswith("file:"):
            return os.path.realpath(path) + LEASE_SUFFIX
    return None


def _offset(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x3FFFFFFF


def _say_waiting(name: str, where: str) -> None:
    sys.stderr.write(f"echo-tune search: another run of study {name!r} is running on {where}; waiting for it to end "
                     f"(this run then continues the study with the layouts still missing)\n")
    sys.stderr.flush()


@contextlib.contextmanager
def run_lease(store, name: str, *, wait_s: float | None = None) -> Iterator[bool]:
    """Hold study ``name``'s run lease on ``store`` for the block, waiting for another holder first (saying so
    once on stderr). Yields whether this run waited. ``wait_s``: give up after that long (TimeoutError)."""
    path = lease_path(store)
    if path is not None:
        with _file_lease(path, name, store.where, wait_s) as waited:
            yield waited
        return
    if store.where.startswith("postgresql"):
        with _pg_lease(store, name, wait_s) as waited:
            yield waited
        return
    yield False


def _waiter(name: str, where: str, wait_s: float | None):
    started = time.monotonic()
    said = [False]

    def wait() -> None:
        if not said[0]:
            said[0] = True
            _say_waiting(name, where)
        if wait_s is not None and time.monotonic() - started > wait_s:
            raise TimeoutError(f"study {name!r} is still being run by another process after {wait_s:.0f} s")
        time.sleep(POLL_S)
    return wait, said


@contextlib.contextmanager
def _file_lease(path: str, name: str, where: str, wait_s: float | None) -> Iterator[bool]:
    fd = open_nofollow(path, os.O_CREAT | os.O_RDWR, "run lease")
    offset = _offset(name)
    wait, said = _waiter(name, where, wait_s)
    try:
        while True:  # polled, not blocking: SIGTERM and Ctrl-C stop the wait at once
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, offset)
                break
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EAGAIN):  # a file system without record locks (ENOLCK)
                    yield False  # runs as before the lease existed
                    return
            wait()
        try:
            yield said[0]
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN, 1, offset)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _pg_lease(store, name: str, wait_s: float | None) -> Iterator[bool]:
    # lazy: loads sqlalchemy (~0.4 s), which importing search.run_lease does not
    from sqlalchemy import text

    key = zlib.crc32(f"echo-tune-run:{store.where}:{name}".encode()) & 0x7FFFFFFF
    wait, said = _waiter(name, store.where, wait_s)
    with store.storage.engine.connect() as conn:
        while True:
            got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
            conn.commit()
            if got:
                break
            wait()
        try:
            yield said[0]
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()
