"""The op-time database: one SQLite file, one row per (device, torch, CUDA, op key), with provenance.

Rows are committed one by one, so an interrupted ``echo-tune profile`` keeps what it measured and the
next run resumes where it stopped. ``load_op_times`` gives the simulator a plain dict key -> seconds
for the cluster's GPU and refuses a database measured on another device, of another schema, with damaged pages,
or with times below a physical floor (``optime_bounds``), each in one line.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import socket
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.errors import ConfigError
from echo_tune.cost.optime.optime_bounds import check_floors
from echo_tune.cost.optime.optime_device import DeviceInfo, mismatch, serves

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS info (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS op_times (
    device TEXT NOT NULL,          -- torch's device name, or "cpu: <model> (<n> threads)"
    device_kind TEXT NOT NULL,     -- cuda | cpu
    torch_version TEXT NOT NULL,
    cuda_version TEXT NOT NULL,
    key TEXT NOT NULL,             -- workload/recording/opkey.py: op, shapes, strides, dtypes, scalar arguments
    op TEXT NOT NULL,              -- e.g. aten.mm.default (also inside key; kept for reading)
    shapes TEXT NOT NULL,          -- tensor shapes, ";"-separated
    dtype TEXT NOT NULL,           -- tensor dtypes, ";"-separated
    time_s REAL NOT NULL,          -- median time of one call
    spread REAL NOT NULL,          -- (p90 - p10) / median of the timed calls
    repeats INTEGER NOT NULL,
    warmup INTEGER NOT NULL,
    method TEXT NOT NULL,          -- [in-situ ]cuda-events | thread-cpu-time | wall-clock
    host TEXT NOT NULL,
    measured_at TEXT NOT NULL,     -- UTC, ISO 8601
    PRIMARY KEY (device, torch_version, cuda_version, key)
);
CREATE TABLE IF NOT EXISTS host_overhead (   -- optime/insitu.py: framework time per op, one per device
    device TEXT NOT NULL, torch_version TEXT NOT NULL, cuda_version TEXT NOT NULL,
    seconds_per_op REAL NOT NULL, ops INTEGER NOT NULL, measured_at TEXT NOT NULL,
    PRIMARY KEY (device, torch_version, cuda_version)
);
"""


SQLITE_HEADER = b"SQLite format 3\x00"
_COLUMNS = ["device", "device_kind", "torch_version", "cuda_version", "key", "op", "shapes", "dtype", "time_s", "spread",
            "repeats", "warmup", "method", "host", "measured_at"]


def _damage(exc: Exception) -> str:
    """What a DatabaseError says of the file: damaged pages, or a schema echo-tune did not write."""
    if "malformed" in str(exc) or "not a database" in str(exc):
        return f"is damaged ({exc}: pages of the file do not read)"
    return f"is not one `echo-tune profile` wrote ({exc})"


def _open_read_only(path: Path) -> sqlite3.Connection:
    """An existing op-time database opened read-only (``mode=ro``): an empty or foreign file is refused in one
    line and left byte for byte as it was."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise ConfigError(f"op-time database {str(path)!r} cannot be read ({exc.strerror or exc}); check the "
                          f"`op_times` path of the profile") from None
    if head != SQLITE_HEADER:
        what = "is empty" if not head else "is not an SQLite database"
        raise ConfigError(f"op-time database {str(path)!r} {what}; point the profile's `op_times` at a database "
                          f"written by `echo-tune profile`, or remove `op_times`")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        conn.execute("SELECT device, device_kind, key, time_s FROM op_times LIMIT 1").fetchall()
    except sqlite3.DatabaseError as exc:
        raise ConfigError(f"op-time database {str(path)!r} is not an op-time database ({exc}); point the "
                          f"profile's `op_times` at a database written by `echo-tune profile`") from None
    return conn


@dataclass(frozen=True, kw_only=True)
class Measurement:
    time_s: float
    spread: float
    repeats: int
    warmup: int
    method: str


class OpTimeDB:
    """An open op-time database (created on first use)."""

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        if read_only:  # reading a profile must never turn the file it names into a database (issue 20)
            self.conn = _open_read_only(self.path)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(self.path)
            tables = {name for (name,) in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            columns = [row[1] for row in self.conn.execute("PRAGMA table_info(op_times)")]
            version = self.conn.execute("SELECT value FROM info WHERE name='schema_version'").fetchone() \
                if "info" in tables else None
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"op-time database {str(self.path)!r} cannot be opened as SQLite ({_damage(exc)}); "
                              f"give another path or delete the file") from None
        if tables and (columns != _COLUMNS or (version is not None and str(version[0]) != str(SCHEMA_VERSION))):
            self.conn.close()  # another program's database, or another schema: left as it is
            got = f"op_times columns {columns or 'none'}" if columns != _COLUMNS else f"schema version {version[0]!r}"
            raise ConfigError(f"op-time database {str(self.path)!r} has another schema ({got}; echo-tune writes its "
                              f"op_times of schema {SCHEMA_VERSION}); give another path or delete the file")
        with self._guard():
            self.conn.executescript(_SCHEMA)
            self.conn.execute("INSERT OR IGNORE INTO info VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            self.conn.commit()

    def close(self) -> None:
        self.conn.close()

    @contextlib.contextmanager
    def _guard(self):
        """A damaged file (pages that do not read) or a foreign schema, met while reading or writing rows: one line."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"op-time database {str(self.path)!r} {_damage(exc)}; give another path or delete the "
                              f"file (`echo-tune profile` writes a new one)") from None

    def __enter__(self) -> "OpTimeDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def known_keys(self, device: DeviceInfo) -> set[str]:
        with self._guard():
            rows = self.conn.execute("SELECT key FROM op_times WHERE device=? AND torch_version=? AND cuda_version=?",
                                     (device.name, device.torch_version, device.cuda_version))
            return {key for (key,) in rows}

    def add(self, device: DeviceInfo, key: str, m: Measurement) -> None:
        """Store one measurement and commit it at once (what makes an interrupted run resumable)."""
        from echo_tune.workload.recording.opkey import key_summary  # torch: only where ops are measured

        op, shapes, dtype = key_summary(key)
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        with self._guard():
            self.conn.execute("INSERT OR REPLACE INTO op_times VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                              (device.name, device.kind, device.torch_version, device.cuda_version, key, op, shapes,
                               dtype, m.time_s, m.spread, m.repeats, m.warmup, m.method, socket.gethostname(), now))
            self.conn.commit()

    def set_host_overhead(self, device: DeviceInfo, seconds_per_op: float, ops: int) -> None:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        with self._guard():
            self.conn.execute("INSERT OR REPLACE INTO host_overhead VALUES (?,?,?,?,?,?)",
                              (device.name, device.torch_version, device.cuda_version, seconds_per_op, ops, now))
            self.conn.commit()

    def devices(self) -> list[tuple[str, str, int]]:
        """(device, kind, rows) of every device in the database, most rows first."""
        with self._guard():
            return list(self.conn.execute("SELECT device, device_kind, COUNT(*) FROM op_times GROUP BY device, "
                                          "device_kind ORDER BY COUNT(*) DESC, device"))


@dataclass(frozen=True, kw_only=True)
class OpTimes:
    """Measured times the simulator consults before its fitted surface."""

    path: str
    device: str
    kind: str
    """"cuda" or "cpu"."""
    times: dict[str, float] = field(repr=False)
    host_overhead_s: float = 0.0
    """Added to every measured op: the framework's host time per op on a CPU device (``optime/insitu.py``);
    zero on CUDA, where the host runs ahead of the GPU."""


def _checked_times(rows, path: Path) -> dict[str, float]:
    """key -> seconds; a time that is not a finite number > 0 (text, NaN, negative) refuses the database."""
    times, bad = {}, []
    for key, value in rows:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
        if ok and isinstance(key, str):
            times[key] = float(value)
        else:
            bad.append((key, value))
    if bad:
        shown = ", ".join(f"{str(k)[:60]!r}: {v!r}" for k, v in bad[:3])
        raise ConfigError(f"op-time database {str(path)!r}: `time_s > 0` (a finite number of seconds) must hold for "
                          f"every op, but {len(bad)} row(s) break it ({shown}{', ...' if len(bad) > 3 else ''}); "
                          f"measure again with `echo-tune profile` into a new file")
    return times


def load_op_times(path: str | Path, gpu_name: str) -> OpTimes:
    """The times measured on the device that serves ``gpu_name``; ConfigError when there is none.

    With several such devices (e.g. CPU runs with different thread counts) the one with most rows
    is used; with several torch/CUDA versions, the latest measurement of each op. The file is read
    read-only and checked: echo-tune's schema, and every time a finite number of seconds > 0.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"op-time database {str(path)!r} does not exist; run `echo-tune profile` to create it "
                          f"or remove `op_times` from the profile")
    conn = _open_read_only(path)
    try:
        version = conn.execute("SELECT value FROM info WHERE name='schema_version'").fetchone()
        if version is None or str(version[0]) != str(SCHEMA_VERSION):
            raise ConfigError(f"op-time database {str(path)!r} has schema version {version and version[0]!r}, "
                              f"echo-tune reads {SCHEMA_VERSION}; measure again with `echo-tune profile`")
        devices = list(conn.execute("SELECT device, device_kind, COUNT(*) FROM op_times GROUP BY device, "
                                    "device_kind ORDER BY COUNT(*) DESC, device"))
        fitting = [(name, kind) for name, kind, _ in devices if serves(str(name), str(kind), gpu_name)]
        if not fitting:
            found = ", ".join(repr(name) for name, _, _ in devices) or "no device (it is empty)"
            why = f" ({mismatch(str(devices[0][0]), str(devices[0][1]), gpu_name)})" if len(devices) == 1 else ""
            raise ConfigError(f"op-time database {str(path)!r} was measured on {found}, not on this cluster's GPU "
                              f"{gpu_name!r}{why}, and op times serve only the same GPU model, memory size and form "
                              f"factor; run `echo-tune profile` on that GPU ({gpu_name}) or remove `op_times` from the "
                              f"profile")
        name, kind = fitting[0]
        times = _checked_times(conn.execute("SELECT key, time_s FROM op_times WHERE device=? ORDER BY measured_at",
                                            (name,)), path)
        check_floors(times, str(kind), gpu_name, str(path))  # 1e-300 s, a GEMM past the GPU's peak: optime_bounds
        host = conn.execute("SELECT seconds_per_op FROM host_overhead WHERE device=? ORDER BY measured_at DESC",
                            (name,)).fetchone()
    except sqlite3.Error as exc:  # damaged pages, or a foreign schema: tables or columns echo-tune did not write
        raise ConfigError(f"op-time database {str(path)!r} {_damage(exc)}; give a file `echo-tune profile` wrote, or "
                          f"remove `op_times` from the profile") from None
    finally:
        conn.close()
    overhead = 0.0
    if host is not None and kind == "cpu":
        overhead = host[0]
        if isinstance(overhead, bool) or not isinstance(overhead, (int, float)) or not math.isfinite(overhead) \
                or overhead < 0:
            raise ConfigError(f"op-time database {str(path)!r}: `seconds_per_op >= 0` must hold for the host "
                              f"overhead, but got ({overhead!r}); measure again with `echo-tune profile`")
    return OpTimes(path=str(path), device=name, kind=kind, times=times, host_overhead_s=float(overhead))
