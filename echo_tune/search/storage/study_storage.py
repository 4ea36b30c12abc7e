"""Where studies live: by default a journal file in ``results/<study-name>/``; any Optuna URL on request.

The default storage is Optuna's ``JournalStorage`` over ``DurableJournalFile``, a journal backend that
writes the same JSON-lines format as Optuna's ``JournalFileBackend`` (so ``optuna-dashboard
results/<name>/journal.log`` opens it) with three changes that make a killed run safe to resume:

* the lock is ``fcntl.flock`` on ``journal.log.flock``: the kernel drops it when the process dies, so a
  SIGKILL never leaves a stale lock behind (Optuna's lock files wait out a 30 s grace period);
* a torn last line (a write cut short by the kill) is skipped by readers and cut off, under the lock,
  before the next record is appended (opening never rewrites the file), but only once no other writer can be finishing it (issue 20): never while Optuna's own lock
  file (``journal.log.lock``, held by a ``JournalFileBackend`` writer such as optuna-dashboard) exists,
  and only after the line has stayed unchanged for ``TAIL_QUIET_S``; a live writer's half-written line
  is left for it to finish;
* a full disk leaves the journal as it was (the partial write is cut back) and says "disk full";
* ``batch()`` groups the records of one trial (or one chunk of exhaustive results) into one write and one
  fsync: a trial reaches the file whole or not at all, and the search pays one fsync per trial.

SQLite (``--storage sqlite:///path.db``) is just as safe but about 20 ms per trial here; PostgreSQL or
MySQL URLs let many machines share one study.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import BaseJournalBackend

from echo_tune.errors import ConfigError
from echo_tune.search.storage.claim import file_lock
from echo_tune.search.storage.storage_checks import (check_journal_path, check_study_folder, check_url, open_nofollow,
                                             redis_backend, storage_error)

JOURNAL_NAME = "journal.log"
TAIL_QUIET_S = 1.0
"""A half-written last line unchanged this long, with no writer holding a lock, was left by a dead writer."""
TAIL_WAIT_S = 30.0
"""How long to wait for another writer to finish its line before refusing to append."""



class DurableJournalFile(BaseJournalBackend):
    """An Optuna journal backend on a local file, safe against SIGKILL (see the module docstring)."""

    def __init__(self, path: str | Path, *, follow_links: bool = True):
        """``follow_links=False`` (the journal in our own results folder): a link planted as the journal is
        never opened through (issue 41); the lock file is never a link in any case."""
        self.path = Path(path)
        self._nofollow = 0 if follow_links else os.O_NOFOLLOW
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(self._open(os.O_CREAT | os.O_WRONLY | os.O_APPEND))
        # beside the real file, so every path to it (a symlink, say) shares the lock; not ".lock": Optuna's
        # own lock files use that name
        self._lock_path = os.path.realpath(self.path) + ".flock"
        self._lock_fd: int | None = None
        self._lock_depth = 0
        self._thread_lock = threading.RLock()
        self._resume_at = (0, 0)  # (log number, byte offset) where the last read stopped
        self._batch: list[dict] | None = None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            if self._lock_depth == 0:
                fd = open_nofollow(self._lock_path, os.O_CREAT | os.O_RDWR, "journal lock")
                fcntl.flock(fd, fcntl.LOCK_EX)
                self._lock_fd = fd
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                    os.close(self._lock_fd)
                    self._lock_fd = None

    def _open(self, flags: int) -> int:
        if self._nofollow:
            return open_nofollow(self.path, flags, "journal")
        return os.open(self.path, flags | os.O_CLOEXEC, 0o644)

    def _file(self, mode: str):
        """The journal opened as ``open(path, mode)`` would (``rb``, ``rb+``, ``ab``), not through a link when
        asked."""
        flags = {"rb": os.O_RDONLY, "rb+": os.O_RDWR, "ab": os.O_WRONLY | os.O_APPEND}[mode]
        return os.fdopen(self._open(flags), mode)

    def _settle_tail(self) -> None:
        """Under our lock: a torn last line is cut once no writer can still be finishing it (module docstring)."""
        deadline = time.monotonic() + TAIL_WAIT_S
        optuna_lock = str(self.path) + ".lock"
        while True:
            st = os.stat(self.path)
            if st.st_size == 0:
                return
            with self._file("rb") as f:
                f.seek(st.st_size - 1)
                if f.read(1) == b"\n":
                    return
            foreign = os.path.lexists(optuna_lock)
            if not foreign and time.time() - st.st_mtime >= TAIL_QUIET_S:
                self._cut_torn_line(st.st_size)
                return
            if time.monotonic() > deadline:
                who = f"Optuna's lock file {optuna_lock!r} exists" if foreign else "it is still changing"
                raise ConfigError(f"journal {str(self.path)!r} ends in a half-written line that another process has "
                                  f"not finished in {TAIL_WAIT_S:.0f} s ({who}); stop the other writer (or remove a "
                                  f"stale lock file) and --resume")
            time.sleep(0.05)

    def _cut_torn_line(self, size: int) -> None:
        with self._file("rb+") as f:
            keep, step = 0, 1 << 16
            pos = size
            while pos > 0:
                start = max(0, pos - step)
                f.seek(start)
                chunk = f.read(pos - start)
                nl = chunk.rfind(b"\n")
                if nl >= 0:
                    keep = start + nl + 1
                    break
                pos = start
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())

    def _file_logs(self, log_number_from: int) -> tuple[list[dict], int]:
        """The file's complete lines from ``log_number_from`` on, and how many lines the file holds."""
        number, offset = self._resume_at if self._resume_at[0] <= log_number_from else (0, 0)
        logs = []
        if os.stat(self.path).st_size == offset:
            return logs, number  # nothing written since the last read (asked once per trial a search stores)
        with self._file("rb") as f:
            f.seek(offset)
            for line in f:
                if not line.endswith(b"\n"):
                    break  # another process is writing this line right now
                if number >= log_number_from:
                    try:
                        logs.append(json.loads(line))
                    except ValueError:  # JSONDecodeError and UnicodeDecodeError: a corrupt line (issue 10)
                        raise ConfigError(
                            f"journal {str(self.path)!r} line {number + 1} is not a JSON record "
                            f"({line[:40]!r}...); a disk or copy error damaged it: remove that line (the trial it "
                            f"belonged to is then lost) and --resume, or start over with --overwrite") from None
                offset += len(line)
                number += 1
        self._resume_at = (number, offset)
        return logs, number

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        with self._thread_lock:
            logs, in_file = self._file_logs(log_number_from)
            if self._batch is not None:  # records of the open batch follow the file's (we hold the lock)
                logs += self._batch[max(0, log_number_from - in_file):]
            return iter(logs)

    def _write(self, logs: list[dict]) -> None:
        """Append under our lock (held by the caller); a failed write (a full disk) is cut back, so the file
        holds whole records only, and reported in one line."""
        data = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode()
        self._settle_tail()
        with self._file("ab") as f:
            size = f.tell()
            try:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.truncate(self.path, size)
                raise storage_error(exc, f"journal {str(self.path)!r}") from exc

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        with self._thread_lock:
            if self._batch is not None:
                self._batch.extend(logs)
                return
            with self._locked():
                self._write(logs)

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Hold the lock and write everything appended inside as one write and one fsync at the end."""
        with self._thread_lock, self._locked():
            if self._batch is not None:  # nested: the outer batch writes
                yield
                return
            self._batch = []
            try:
                yield
            finally:
                logs, self._batch = self._batch, None
                if logs:
                    self._write(logs)


@dataclass
class StudyStorage:
    """An opened storage: the Optuna storage, where it is (for messages), and our journal if it is one."""

    storage: Any
    where: str
    journal: DurableJournalFile | None = None
    notes: list[str] = field(default_factory=list)
    """What opening it did that the search's notes should say (what ``--overwrite`` kept)."""

    def batch(self) -> contextlib.AbstractContextManager:
        """Group writes into one (our journal file); a no-op for other storages."""
        return self.journal.batch() if self.journal is not None else contextlib.nullcontext()


def open_storage(results_dir: Path, url: str | None = None) -> StudyStorage:
    """``url`` if given (an Optuna storage URL, or a journal file path), else ``results_dir/journal.log``."""
    if url is None or "://" not in url:
        if url is None:  # our own results folder: no link planted there is followed (issue 41)
            check_study_folder(results_dir, JOURNAL_NAME)
        path = Path(url) if url is not None else results_dir / JOURNAL_NAME
        check_journal_path(path)
        journal = DurableJournalFile(path, follow_links=url is not None)
        return StudyStorage(JournalStorage(journal), str(path), journal)
    check_url(url)
    if url.startswith("redis://"):
        return StudyStorage(JournalStorage(redis_backend(url)), url)
    kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
    for attempt in range(RDB_OPEN_ATTEMPTS):
        try:
            with _sqlite_create_lock(url):  # SQLite: one process creates the tables, the others wait
                return StudyStorage(optuna.storages.RDBStorage(url, engine_kwargs=kwargs), url)
        except ImportError as exc:  # the URL's driver is not installed
            raise ConfigError(f"cannot open --storage {url!r}: {str(exc).splitlines()[0]} (install the "
                              f"database's Python driver, e.g. psycopg[binary] for PostgreSQL)") from None
        except Exception as exc:  # noqa: BLE001 - bad URL, unreachable server, or a race (below)
            # Workers started together on a fresh database race to create Optuna's tables: all but one
            # fail (e.g. a UNIQUE violation on alembic_version); the tables exist a moment later.
            if attempt == RDB_OPEN_ATTEMPTS - 1 or not _maybe_race(exc):
                raise ConfigError(f"cannot open --storage {url!r}: {str(exc).splitlines()[0]}") from None
            time.sleep(0.2 + random.random() * 0.5)
    raise AssertionError("not reached")


RDB_OPEN_ATTEMPTS = 8


def _maybe_race(exc: Exception) -> bool:
    """An error another worker's concurrent table creation can cause (not a bad URL or a refused login)."""
    try:
        # lazy: loads sqlalchemy (~0.4 s), which importing search.storage does not
        from sqlalchemy import exc as sa_exc
    except ImportError:
        return False
    if isinstance(exc, sa_exc.OperationalError):  # SQLite: "table ... already exists", "database is locked"
        return "already exists" in str(exc) or "locked" in str(exc)
    return isinstance(exc, (sa_exc.IntegrityError, sa_exc.ProgrammingError, sa_exc.InternalError))


@contextlib.contextmanager
def _sqlite_create_lock(url: str) -> Iterator[None]:
    """``flock`` on ``<database>.flock`` while a local SQLite database is opened (and maybe created)."""
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else ""
    if not path or path == ":memory:" or not Path(path).parent.is_dir():
        yield
        return
    with file_lock(path + ".flock"):
        yield
