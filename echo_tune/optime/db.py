"""The op-time database: one SQLite file, one row per (device, torch, CUDA, op key), with provenance.

Rows are committed one by one, so an interrupted ``echo-tune profile`` keeps what it measured and the
next run resumes where it stopped. ``load_op_times`` gives the simulator a plain dict key -> seconds
for the cluster's GPU and refuses a database measured on another device (one line).
"""

from __future__ import annotations

import datetime
import socket
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.errors import ConfigError
from echo_tune.optime.device import DeviceInfo, serves

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS info (name TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS op_times (
    device TEXT NOT NULL,          -- torch's device name, or "cpu: <model> (<n> threads)"
    device_kind TEXT NOT NULL,     -- cuda | cpu
    torch_version TEXT NOT NULL,
    cuda_version TEXT NOT NULL,
    key TEXT NOT NULL,             -- workload/opkey.py: op, shapes, strides, dtypes, scalar arguments
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


@dataclass(frozen=True, kw_only=True)
class Measurement:
    time_s: float
    spread: float
    repeats: int
    warmup: int
    method: str


class OpTimeDB:
    """An open op-time database (created on first use)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = sqlite3.connect(self.path)
            self.conn.executescript(_SCHEMA)
            self.conn.execute("INSERT OR IGNORE INTO info VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            self.conn.commit()
        except sqlite3.DatabaseError as exc:
            raise ConfigError(f"op-time database {str(self.path)!r} cannot be opened as SQLite ({exc}); "
                              f"give another path or delete the file") from None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "OpTimeDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def known_keys(self, device: DeviceInfo) -> set[str]:
        rows = self.conn.execute("SELECT key FROM op_times WHERE device=? AND torch_version=? AND cuda_version=?",
                                 (device.name, device.torch_version, device.cuda_version))
        return {key for (key,) in rows}

    def add(self, device: DeviceInfo, key: str, m: Measurement) -> None:
        """Store one measurement and commit it at once (what makes an interrupted run resumable)."""
        from echo_tune.workload.opkey import key_summary  # torch: only where ops are measured

        op, shapes, dtype = key_summary(key)
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.conn.execute("INSERT OR REPLACE INTO op_times VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                          (device.name, device.kind, device.torch_version, device.cuda_version, key, op, shapes,
                           dtype, m.time_s, m.spread, m.repeats, m.warmup, m.method, socket.gethostname(), now))
        self.conn.commit()

    def set_host_overhead(self, device: DeviceInfo, seconds_per_op: float, ops: int) -> None:
        now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        self.conn.execute("INSERT OR REPLACE INTO host_overhead VALUES (?,?,?,?,?,?)",
                          (device.name, device.torch_version, device.cuda_version, seconds_per_op, ops, now))
        self.conn.commit()

    def devices(self) -> list[tuple[str, str, int]]:
        """(device, kind, rows) of every device in the database, most rows first."""
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


def load_op_times(path: str | Path, gpu_name: str) -> OpTimes:
    """The times measured on the device that serves ``gpu_name``; ConfigError when there is none.

    With several such devices (e.g. CPU runs with different thread counts) the one with most rows
    is used; with several torch/CUDA versions, the latest measurement of each op.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"op-time database {str(path)!r} does not exist; run `echo-tune profile` to create it "
                          f"or remove `op_times` from the profile")
    with OpTimeDB(path) as db:
        devices = db.devices()
        fitting = [(name, kind) for name, kind, _ in devices if serves(name, kind, gpu_name)]
        if not fitting:
            found = ", ".join(repr(name) for name, _, _ in devices) or "no device (it is empty)"
            raise ConfigError(f"op-time database {str(path)!r} was measured on {found}, not on this cluster's GPU "
                              f"{gpu_name!r}; run `echo-tune profile` on a {gpu_name} or remove `op_times` from "
                              f"the profile")
        name, kind = fitting[0]
        rows = db.conn.execute("SELECT key, time_s FROM op_times WHERE device=? ORDER BY measured_at", (name,))
        times = {key: float(t) for key, t in rows}
        host = db.conn.execute("SELECT seconds_per_op FROM host_overhead WHERE device=? ORDER BY measured_at DESC",
                               (name,)).fetchone()
    overhead = float(host[0]) if host is not None and kind == "cpu" else 0.0
    return OpTimes(path=str(path), device=name, kind=kind, times=times, host_overhead_s=overhead)
