"""Traced pieces kept on disk, so a search over known shapes neither imports torch nor traces.

A trace depends on the model, the shape (TP, CP, sequence parallelism, micro-batch, precision), the
tracer's code and torch. The file name is a hash of all four (the code as the bytes of every module of
``echo_tune.workload``, torch as its installed version, read without importing it), so a change to any
of them misses the cache instead of reading a stale trace.

Where: ``$ECHO_TUNE_CACHE_DIR/traces`` if set, else ``$XDG_CACHE_HOME/echo-tune/traces`` (default
``~/.cache``). ``ECHO_TUNE_TRACE_CACHE=0`` turns it off. The cache is best-effort: a file that cannot
be read or written is traced again, never an error; a cache folder that cannot even be looked into (no
permission, a name too long) is skipped for the rest of the process, with one note on stderr (issue 41).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import sys
import tempfile
from importlib import metadata
from pathlib import Path
import echo_tune.workload as workload


_UNUSABLE: set[str] = set()
"""Cache folders found unreadable in this process (noted once, then skipped)."""


def cache_dir() -> Path | None:
    if os.environ.get("ECHO_TUNE_TRACE_CACHE", "1") == "0":
        return None
    root = _root()
    return None if str(root) in _UNUSABLE else root


def _root() -> Path:
    root = os.environ.get("ECHO_TUNE_CACHE_DIR")
    if root:
        return Path(root) / "traces"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "echo-tune" / "traces"


@functools.lru_cache(maxsize=1)
def _fingerprint() -> str:
    """Hash of the tracer's code and of the specs it reads (workload/ and config/, whose model properties shape the
    trace: a change there with the same model fields must not reuse a stale trace), torch's and Python's versions."""
    h = hashlib.sha256()
    package = Path(workload.__file__).parent.parent
    for path in sorted([*(package / "workload").rglob("*.py"), *(package / "config").rglob("*.py")]):
        h.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    h.update(f"{torch_version}|{sys.version_info[:2]}".encode())
    return h.hexdigest()


def _path(key: tuple) -> Path | None:
    root = cache_dir()
    if root is None:
        return None
    digest = hashlib.sha256(f"{_fingerprint()}|{key!r}".encode()).hexdigest()
    return root / f"{digest}.pkl"


def _is_file(path: Path) -> bool:
    """Whether the cache holds ``path``; a folder that cannot be looked into is skipped with one note."""
    try:
        return path.is_file()
    except OSError as exc:  # EACCES, ENAMETOOLONG, ... (is_file swallows only "not there")
        root = str(path.parent)
        if root not in _UNUSABLE:
            _UNUSABLE.add(root)
            sys.stderr.write(f"note: the trace cache folder {root!r} cannot be read ({exc.strerror or exc}); tracing "
                             f"without it (give ECHO_TUNE_CACHE_DIR a folder you can read, or set "
                             f"ECHO_TUNE_TRACE_CACHE=0)\n")
        return False


def load(key: tuple):
    """The pieces stored for ``key`` (a ``passes.pieces_key``), or None."""
    path = _path(key)
    if path is None or not _is_file(path):
        return None
    try:
        with open(path, "rb") as f:
            stored_key, pieces = pickle.load(f)
    except Exception:  # noqa: BLE001 - a torn or foreign file: trace again
        return None
    return pieces if stored_key == key else None


def stored(key: tuple) -> bool:
    """Whether the cache holds a file for ``key`` (another process can ``load`` it instead of being sent it)."""
    path = _path(key)
    return path is not None and _is_file(path)


def save(key: tuple, pieces) -> None:
    path = _path(key)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as f:
            pickle.dump((key, pieces), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(f.name, path)  # atomic: concurrent searches never read a half-written file
    except OSError:
        pass
