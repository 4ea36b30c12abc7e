"""The raw files ``echo-tune bench`` writes under ``calibration/<cluster-name>/raw/``, and their reader.

Every CSV has units in its column names (``_us``, ``_bytes``, ``_gbyte_s``; ``tflops`` is 1e12
FLOP/s); ``env.json`` holds the hardware and software versions and how the bench was run.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from echo_tune.errors import CalibrationError
from echo_tune.io import atomic_path, read_csv_rows, read_text, write_text

RAW_FORMAT_VERSION = 1
COLUMNS = {
    "gemm": ("rank", "device", "dtype", "m", "n", "k", "time_us", "tflops"),
    "attention": ("rank", "device", "dtype", "batch", "heads", "seq_len", "head_dim", "causal", "phase",
                  "time_us", "flops", "tflops"),
    "memory": ("rank", "device", "dtype", "size_bytes", "bytes_moved", "time_us", "bandwidth_gbyte_s"),
    "collectives": ("collective", "scope", "group_size", "num_nodes", "ranks_per_node", "dtype", "size_bytes",
                    "time_us", "algbw_gbyte_s", "busbw_gbyte_s", "iters"),
    "interference": ("gemm_m", "gemm_n", "gemm_k", "dtype", "collective", "comm_scope", "group_size", "num_nodes",
                     "ranks_per_node", "size_bytes", "gemm_alone_us", "gemm_with_comm_us", "comm_alone_us",
                     "comm_with_gemm_us", "compute_slowdown", "comm_slowdown"),
}
_TEXT_COLUMNS = {"device", "dtype", "phase", "collective", "scope", "comm_scope"}


def check_bench_name(name: str) -> str:
    """``--name`` is one folder under ``--output-root``: no path separators, no ``..``, not absolute."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise CalibrationError(f"`--name` must be a plain folder name (results go to <output-root>/<name>/raw/), "
                               f"but got ({name!r}); give a name without '/', '\\' or '..'")
    return name


def raw_dir(output_root: str | Path, name: str) -> Path:
    return Path(output_root) / check_bench_name(name) / "raw"


def write_csv(directory: Path, kind: str, rows: list[dict]) -> Path:
    """Write one raw table; the columns are COLUMNS[kind], in that order."""
    path = directory / f"{kind}.csv"
    with atomic_path(path, "raw benchmark table") as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS[kind], extrasaction="raise")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return path


def write_env(directory: Path, env: dict) -> Path:
    return write_text(directory / "env.json", json.dumps({"raw_format_version": RAW_FORMAT_VERSION, **env}, indent=2,
                                                         sort_keys=True) + "\n", "benchmark environment file")


def _convert(value: str, column: str, where: str):
    if column in _TEXT_COLUMNS:
        return value
    if column == "causal":
        return value.strip().lower() in ("true", "1")
    try:
        number = float(value)
    except ValueError:
        raise CalibrationError(f"{where}: column {column!r} must be a number, but got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise CalibrationError(f"{where}: column {column!r} must be a finite number >= 0, but got {value!r}; "
                               f"re-run `echo-tune bench` or drop the row")
    return int(number) if number.is_integer() and column not in ("time_us", "tflops") else number


def read_csv(directory: Path, kind: str) -> list[dict]:
    """Rows of one raw table (empty when the file is absent); each row keeps its ``_source``."""
    path = directory / f"{kind}.csv"
    if not path.is_file():
        return []
    header, raw_rows = read_csv_rows(path, "bench table")  # BOM, short rows, non-UTF-8: one-line errors
    missing = sorted(set(COLUMNS[kind]) - set(header))
    if missing:
        raise CalibrationError(f"{path}: missing column(s) {missing}; expected {list(COLUMNS[kind])} "
                               f"(re-run `echo-tune bench`)")
    rows = []
    for number, raw in enumerate(raw_rows, start=2):
        where = f"{path} row {number}"
        if any(raw.get(c) in (None, "") for c in COLUMNS[kind]):
            raise CalibrationError(f"{where}: a row needs all {len(COLUMNS[kind])} columns filled")
        row = {c: _convert(raw[c], c, where) for c in COLUMNS[kind]}
        row["_source"] = f"{path.name} row {number}"
        rows.append(row)
    return rows


def read_env(directory: Path) -> dict:
    path = directory / "env.json"
    if not path.is_file():
        raise CalibrationError(f"{path} does not exist; --bench takes the directory `echo-tune bench` wrote "
                               f"(calibration/<name>/raw or calibration/<name>)")
    try:
        return json.loads(read_text(path, "bench env file"))
    except json.JSONDecodeError as exc:
        raise CalibrationError(f"{path} is not valid JSON at line {exc.lineno}: {exc.msg}") from None


def resolve_bench_dir(path: str | Path) -> Path:
    """Accept calibration/<name> or calibration/<name>/raw."""
    path = Path(path)
    return path / "raw" if (path / "raw" / "env.json").is_file() else path
