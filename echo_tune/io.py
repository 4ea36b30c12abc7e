"""Reading and writing files in one place: OS and decoding errors become one-line ConfigErrors.

Every message names the file, what it was meant to be, what went wrong (the OS's own words) and the
way out (issue 10). ``cli.main`` also turns any OSError that escapes elsewhere into the same kind of
line, so no file problem ends in a traceback.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

from echo_tune.errors import ConfigError


def os_error_message(exc: OSError, what: str = "file") -> str:
    """One line for an OSError: the path, the OS's reason and a hint at the fix."""
    path = exc.filename if exc.filename is not None else "?"
    hints = {
        "IsADirectoryError": "give a file path, not a directory",
        "NotADirectoryError": "a part of the path is a file; give a directory path",
        "FileNotFoundError": "check the path",
        "PermissionError": "choose a path you can write to, or fix its permissions",
        "FileExistsError": "a file stands where a folder is needed; remove it or choose another path",
    }
    hint = hints.get(type(exc).__name__, "check the path and the disk")
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


def write_text(path: str | Path, text: str, what: str = "file") -> Path:
    """Write ``text`` (creating the parent folders), or raise a one-line ConfigError."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(os_error_message(exc, what)) from None
    return path


def ensure_dir(path: str | Path, what: str = "folder") -> Path:
    """Create ``path`` as a folder we can write into, or raise a one-line ConfigError."""
    path = Path(path)
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
