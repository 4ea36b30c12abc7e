"""Storage settings that cannot work, refused in one line before a search starts, and storage failures
(a full disk) said in one line (issue 20)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from optuna.storages.journal import JournalRedisBackend

from echo_tune.errors import ConfigError


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk or the quota is full."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "disk is full" in str(exc) or "No space left" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def storage_error(exc: BaseException, where: str) -> ConfigError:
    """One line for a storage that failed to write (Optuna's StorageInternalError, an OSError)."""
    if disk_full(exc):
        return ConfigError(f"disk full: cannot write the study to {where}; free some space and --resume (the "
                           f"trials already stored are kept)")
    cause = exc.__cause__ or exc
    return ConfigError(f"cannot write the study to {where}: {str(cause).splitlines()[0] if str(cause) else type(cause).__name__}; "
                       f"check the storage and --resume")


def check_journal_path(path: Path) -> None:
    """A journal is a regular file: ``/dev/zero`` (endless), a FIFO or a folder is refused in one line."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"cannot open --storage {str(path)!r}: {exc.strerror or exc}; give a journal file path "
                          f"or a database URL") from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "a device, pipe or socket"
        raise ConfigError(f"`--storage` must be a regular journal file or a database URL, but got ({str(path)!r}, "
                          f"{kind}); give a file path such as results/study.log or sqlite:///study.db")


def check_url(url: str) -> None:
    """Storages that would lose the study: an in-memory SQLite database lives and dies with one process."""
    lowered = url.lower()
    if lowered.startswith("sqlite") and (lowered.split("://", 1)[1] in ("", "/") or ":memory:" in lowered
                                         or "mode=memory" in lowered):
        raise ConfigError(f"`--storage` must outlive the search, but got ({url!r}): an in-memory SQLite database "
                          f"is lost when the process ends and is not shared with --n-jobs workers; give a file, "
                          f"e.g. sqlite:///study.db, or leave --storage out for a journal")


def redis_backend(url: str):
    try:
        import redis  # noqa: F401 - Optuna's JournalRedisBackend needs it

        backend = JournalRedisBackend(url)
        backend._redis.ping()
    except ImportError as exc:
        raise ConfigError(f"cannot open --storage {url!r}: {str(exc).splitlines()[0]} (install the `redis` "
                          f"package, or use a journal file or sqlite:///study.db)") from None
    except Exception as exc:  # noqa: BLE001 - no server there, refused login, bad URL
        raise ConfigError(f"cannot open --storage {url!r}: {str(exc).splitlines()[0]}; start the Redis server or "
                          f"check the URL") from None
    return backend


def link_refusal(link: Path, what: str) -> ConfigError:
    """One line for a symbolic link planted where echo-tune writes in its own results folder (issue 41)."""
    try:
        target = os.readlink(link)
    except OSError:
        target = "?"
    return ConfigError(f"{what} {str(link)!r} is a symbolic link (to {target!r}); echo-tune never writes through "
                       f"a link in its results folder: remove the link, or give --results-dir / --study-name "
                       f"another folder")


def check_study_folder(study_dir: Path, journal_name: str) -> None:
    """Refuse (one line) a study folder that is a link, or a link planted as its journal or the journal's lock."""
    study_dir = Path(study_dir)
    if study_dir.is_symlink():
        raise link_refusal(study_dir, "study folder")
    for name, what in ((journal_name, "journal"), (journal_name + ".flock", "journal lock")):
        if (study_dir / name).is_symlink():
            raise link_refusal(study_dir / name, what)


def open_nofollow(path: str | Path, flags: int, what: str, mode: int = 0o644) -> int:
    """``os.open`` that never follows a link at ``path`` (one line instead, naming it)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or Path(path).is_symlink():
            raise link_refusal(Path(path), what) from None
        raise
