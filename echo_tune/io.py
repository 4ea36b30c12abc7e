"""Reading and writing files in one place: OS and decoding errors become one-line ConfigErrors.

Every message names the file, what it was meant to be, what went wrong (the OS's own words) and the
way out (issue 10). ``cli.main`` also turns any OSError that escapes elsewhere into the same kind of
line, so no file problem ends in a traceback.

Every output is written safely (issue 20): into a temporary file beside it, then moved into place with
one ``os.replace`` (a reader never sees half a file, an interrupted write leaves the old one), and never
through a symbolic link unless the caller asks (``follow_symlinks=True``): a link planted where an
output goes (``best.json`` -> ``~/.bashrc``) is refused in one line instead of overwriting its target.
A device, a FIFO or a standard stream (``-``, ``/dev/stdout``) is written as the user named it, never
replaced (``io_targets``, issue 41), and a failed write is one line naming the output, never a success.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from echo_tune.errors import ConfigError
from echo_tune.io_targets import stream_target, write_error, write_stream


def os_error_message(exc: OSError, what: str = "file") -> str:
    """One line for an OSError: the path, the OS's reason and a hint at the fix."""
    if exc.filename is None and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
        # every file echo-tune writes is named in its errors (atomic_path, io_targets): a write that names
        # none is the command's own output (`echo-tune simulate > /dev/full`)
        return write_error(exc, "", "standard output")
    path = exc.filename if exc.filename is not None else "?"
    hints = {
        "IsADirectoryError": "give a file path, not a directory",
        "NotADirectoryError": "a part of the path is a file; give a directory path",
        "FileNotFoundError": "check the path",
        "PermissionError": "choose a path you can write to, or fix its permissions",
        "FileExistsError": "a file stands where a folder is needed; remove it or choose another path",
    }
    hint = hints.get(type(exc).__name__, "check the path and the disk")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full: cannot write {what} {str(path)!r} ({exc.strerror or exc}); free some space and run again"
    return f"{what} {str(path)!r}: {exc.strerror or exc}; {hint}"


def read_text(path: str | Path, what: str = "file") -> str:
    """The file's text as UTF-8 (a byte-order mark is dropped), or a one-line ConfigError."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(os_error_message(exc, what)) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{what} {str(path)!r} is not UTF-8 text (byte {data[exc.start]:#04x} at line {line}); "
                          f"save it as UTF-8") from None


def check_not_symlink(path: str | Path, what: str = "output") -> None:
    """Refuse (one line) to write ``path`` when it is a symbolic link: its target would be overwritten."""
    path = Path(path)
    if path.is_symlink() and stream_target(path) is None:  # /dev/stdout is a link, and no one's file
        raise ConfigError(f"{what} {str(path)!r} is a symbolic link (to {os.readlink(path)!r}); echo-tune does "
                          f"not write through links: remove the link or give another path")


def _new_file_mode(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777  # an existing output keeps its permissions
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


@contextlib.contextmanager
def atomic_path(path: str | Path, what: str = "file", *, follow_symlinks: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` to write into; when the block ends without an error it replaces
    ``path`` in one ``os.replace`` (on an error it is removed and ``path`` is left as it was).

    ``path`` may not be a symbolic link (one-line ConfigError) unless ``follow_symlinks``: then the
    link's target is replaced. The temporary file keeps ``path``'s suffix (writers that pick a format by
    suffix, as matplotlib does, see the right one). OS errors (a full disk, say) become one-line
    ConfigErrors. A device, FIFO or standard stream (``io_targets.stream_target``) is not replaced: the
    temporary file is made in the temporary folder and its bytes written to the stream."""
    stream = stream_target(path)
    if stream is not None:  # a device, FIFO or standard stream: written in place, never replaced
        yield from _via_stream(stream, Path(path), what)
        return
    path = Path(path)
    if path.is_symlink():
        if not follow_symlinks:
            check_not_symlink(path, what)
        path = Path(os.path.realpath(path))
        stream = stream_target(path)
        if stream is not None:  # followed on request to a device or a FIFO
            yield from _via_stream(stream, path, what)
            return
    if path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a directory; give a file path, not a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp" + path.suffix)
        os.close(fd)
    except OSError as exc:
        raise ConfigError(os_error_message(exc, what)) from None
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, _new_file_mode(path))
        os.replace(tmp_path, path)
    except OSError as exc:
        tmp_path.unlink(missing_ok=True)
        if exc.filename is None:  # a failed write() names no file: name the output, not "?"
            raise write_error(exc, what, str(path)) from None
        if exc.filename == tmp:
            exc.filename = str(path)
        raise ConfigError(os_error_message(exc, what)) from None
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def _via_stream(stream, path: Path, what: str) -> Iterator[Path]:
    """``atomic_path`` for a stream: a temporary file in the temporary folder (never beside a device), copied
    to the stream when the block ends without an error."""
    try:
        fd, tmp = tempfile.mkstemp(prefix="echo-tune-", suffix=".tmp" + path.suffix)
        os.close(fd)
    except OSError as exc:
        raise ConfigError(os_error_message(exc, f"temporary file for {what}")) from None
    try:
        yield Path(tmp)
        write_stream(stream, tmp, what)
    except OSError as exc:
        raise stream.error(exc, what) from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def write_bytes(path: str | Path, data: bytes, what: str = "file", *, follow_symlinks: bool = False) -> Path:
    """Write ``data`` atomically (see ``atomic_path``), creating the parent folders; a device, FIFO or standard
    stream is written in place."""
    stream = stream_target(path)
    if stream is not None:
        write_stream(stream, data, what)
        return Path(path)
    with atomic_path(path, what, follow_symlinks=follow_symlinks) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_text(path: str | Path, text: str, what: str = "file", *, follow_symlinks: bool = False) -> Path:
    """Write ``text`` as UTF-8 atomically (creating the parent folders), or raise a one-line ConfigError."""
    return write_bytes(path, text.encode("utf-8"), what, follow_symlinks=follow_symlinks)


def ensure_dir(path: str | Path, what: str = "folder") -> Path:
    """Create ``path`` as a folder we can write into, or raise a one-line ConfigError."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise ConfigError(f"{what} {str(path)!r} is a symbolic link to {os.readlink(path)!r}, which does not exist; "
                          f"echo-tune does not create folders through links: remove the link or give another path")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {str(path)!r} is a file, not a folder; give a folder path")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(os_error_message(exc, what)) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {str(path)!r} is not writable; choose another folder or fix its permissions")
    return path


def read_csv_rows(path: str | Path, what: str = "CSV file") -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a CSV file (UTF-8, byte-order mark allowed); a row shorter or longer than
    the header is a one-line ConfigError naming its line."""
    text = read_text(path, what)
    reader = csv.reader(text.splitlines())
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        raise ConfigError(f"{what} {str(path)!r} is empty; it needs a header line and rows") from None
    except csv.Error as exc:
        raise ConfigError(f"{what} {str(path)!r} line 1: {exc}") from None
    rows = []
    try:
        for fields in reader:
            if not fields or all(not f.strip() for f in fields):
                continue
            if len(fields) != len(header):
                raise ConfigError(f"{what} {str(path)!r} line {reader.line_num}: {len(fields)} fields but the "
                                  f"header has {len(header)}; fix or remove the row")
            rows.append(dict(zip(header, fields)))
    except csv.Error as exc:
        raise ConfigError(f"{what} {str(path)!r} line {reader.line_num}: {exc}") from None
    return header, rows
