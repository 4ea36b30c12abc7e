"""Outputs that are not regular files: a device, a FIFO or a standard stream, written as the user named them
(issue 41).

``echo_tune.io`` writes a regular file (or a new path) atomically: a temporary file beside it, then one
``os.replace``. Over ``/dev/null``, ``/dev/full``, a named pipe or ``/dev/stdout`` that would be wrong twice:
the temporary file cannot be made in ``/dev`` (a normal user was refused, naming a temporary file) and, as
root, the rename swapped the device node for a regular file. Such a target is written in place instead:

* ``-``, ``/dev/stdout`` and ``/dev/stderr`` (and ``/dev/fd/N``, ``/proc/self/fd/N`` for N = 1, 2) are this
  process's own stdout / stderr, written through ``sys.stdout`` / ``sys.stderr`` after they are flushed, so
  the bytes come in order with the command's other output;
* any other ``/dev/fd/N`` or ``/proc/self/fd/N`` link, and a path that is a character or block device, a FIFO
  or a socket, is opened for writing (never created, never truncated away) and written.

A failed write (``ENOSPC`` from ``/dev/full``, ``EFBIG``, ``EPIPE`` from a reader that went away) is a
one-line ConfigError naming the target, never reported as success.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path
import errno

from echo_tune.errors import ConfigError

STDOUT_NAMES = ("-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1")
STDERR_NAMES = ("/dev/stderr", "/dev/fd/2", "/proc/self/fd/2")
_FD_LINK = re.compile(r"^/(dev/fd|proc/self/fd)/\d+$")
CHUNK = 1 << 20


@dataclass(frozen=True)
class Stream:
    """A non-regular output: ``name`` as the user gave it; ``stream`` is ``stdout``, ``stderr`` or ``path``."""

    name: str
    stream: str

    def error(self, exc: OSError, what: str) -> ConfigError:
        """``write_error`` naming this stream: its path, or which standard stream (as the user named it)."""
        if self.stream == "path":
            return write_error(exc, what, self.name)
        where = "standard output" if self.stream == "stdout" else "standard error"
        return write_error(exc, "", f"{what} to {where} ({self.name!r})")


def stream_target(path: str | Path) -> Stream | None:
    """The stream ``path`` names, or None for a regular file, a folder, a link or a path that does not exist
    (those are ``echo_tune.io``'s to write atomically or refuse)."""
    name = str(path)
    if name in STDOUT_NAMES:
        return Stream(name, "stdout")
    if name in STDERR_NAMES:
        return Stream(name, "stderr")
    if _FD_LINK.match(name):
        return Stream(name, "path")
    try:
        mode = os.lstat(name).st_mode
    except OSError:
        return None
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return Stream(name, "path")
    return None


def write_error(exc: OSError, what: str, target: str) -> ConfigError:
    """One line for a write to ``target`` that failed, naming it, the OS's reason and the way out (``what``
    empty: ``target`` is a description, as "standard output", not a path)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    name = f"{what} {target!r}" if what else target
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ConfigError(f"disk full: cannot write {name} ({reason}); free some space or give "
                           f"another path, and run again")
    if exc.errno == errno.EFBIG:
        return ConfigError(f"cannot write {name}: {reason} (the file size limit, `ulimit -f`, or the "
                           f"file system's largest file); raise the limit or give another path")
    if exc.errno == errno.EPIPE:
        return ConfigError(f"cannot write {name}: {reason} (its reader closed it before the end); keep "
                           f"the reader open until echo-tune ends, or give a file path")
    return ConfigError(f"cannot write {name}: {reason}; check the path and the disk")


def write_stream(target: Stream, source, what: str = "file") -> None:
    """Write ``source`` (bytes, or a path whose bytes are copied) to ``target``; a one-line ConfigError on
    any failure."""
    def chunks():
        if isinstance(source, (bytes, bytearray, memoryview)):
            yield bytes(source)
            return
        with open(source, "rb") as f:
            while block := f.read(CHUNK):
                yield block
    try:
        if target.stream in ("stdout", "stderr"):
            text = sys.stdout if target.stream == "stdout" else sys.stderr
            text.flush()
            binary = getattr(text, "buffer", None)
            for block in chunks():
                if binary is not None:
                    binary.write(block)
                else:
                    text.write(block.decode("utf-8", "replace"))
            (binary or text).flush()
            return
        fd = os.open(target.name, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):  # /dev/fd/3 of `3>file`: written as the shell's `>` would
                os.ftruncate(fd, 0)
            for block in chunks():
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    except OSError as exc:
        raise target.error(exc, what) from None
