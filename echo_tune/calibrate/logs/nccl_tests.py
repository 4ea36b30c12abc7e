"""Parse nccl-tests output (all_reduce_perf, all_gather_perf, ...) into rows with units.

Handles every layout nccl-tests has printed: with or without ``redop`` / ``root`` columns,
``error`` or ``#wrong`` columns, out-of-place and in-place groups, MPI tags such as
``[1,0]<stdout>:`` anywhere in a line (``mpirun --tag-output`` interleaves two ranks' output
mid-line), and Slurm's ``srun --label`` prefixes (``0: ``). The GPU count and the node layout
come from the header lines ``#  Rank N [Group G] Pid P on HOST device D [BUS] NAME``; every host
must hold the same number of ranks. A row whose ``#wrong`` count is not 0 measured a broken
run: it is refused (kept out of ``rows``, listed in ``refused_rows``). A cut result row is an error
naming its line; a table that stops before ``maxBytes`` without nccl-tests' closing lines gives a
warning.

Nothing is silently dropped: a line that is neither a ``#`` header, a blank line, a result row,
an MPI stderr line nor an NCCL debug line raises a CalibrationError naming its line number;
stderr and NCCL debug lines are kept in ``NcclTestsLog.ignored_lines`` with the reason.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.calibrate.logs.log_checks import check_rank_numbers, check_rows_match_collective, check_single_run
from echo_tune.calibrate.logs.nccl_tests_log import NcclTestsLog, NcclTestsRow, RankInfo
from echo_tune.cost.collectives.comm import bus_factor
from echo_tune.errors import CalibrationError

# nccl-tests binary stem (spelling without "_") -> echo-tune collective name (workload/graph.py).
COLLECTIVE_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                      "alltoall": "all_to_all", "sendrecv": "send_recv", "broadcast": "broadcast",
                      "reduce": "reduce"}
_MPI_TAG = re.compile(r"\[\d+,\d+\]<(stdout|stderr)>:")
_SRUN_PREFIX = re.compile(r"^\d+: ")
_RANK_LINE = re.compile(r"#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)"
                        r"\s+(?:\[[^\]]*\]\s*)?(.*)$")
_START_LINE = re.compile(r"#\s*Collective test starting:\s*(\S+)")
_AVG_LINE = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
_NCCL_DEBUG = re.compile(r"\bNCCL (INFO|WARN|TRACE|VERSION)\b")
_KEY_COLUMNS = {"size": "size", "bytes": "size", "count": "count", "n": "count", "type": "type",
                "redop": "redop", "op": "redop", "root": "root", "dist": "dist"}
_MEASURE_COLUMNS = ("time", "algbw", "busbw")


def collective_from_name(name: str) -> str | None:
    """The collective a file or binary name refers to (``all_reduce_16gpu.log`` -> all_reduce)."""
    squashed = re.sub(r"[^a-z]", "", Path(name).name.lower())
    for alias in sorted(COLLECTIVE_ALIASES, key=len, reverse=True):
        if alias in squashed:
            return COLLECTIVE_ALIASES[alias]
    return None


def _strip_prefix(raw: str) -> tuple[str, bool]:
    """The line without MPI tags (anywhere in it) or an srun label, and whether it came from stderr."""
    match = _MPI_TAG.search(raw)
    if match:
        from_stderr = match.start() == 0 and match.group(1) == "stderr"
        return _MPI_TAG.sub("", raw), from_stderr
    match = _SRUN_PREFIX.match(raw)
    return (raw[match.end():] if match else raw), False


def _column_layout(tokens: list[str], where: str) -> list[str]:
    """Names of the columns of a ``# size count type ...`` line, key columns normalised."""
    first = tokens.index("time")
    keys = []
    for token in tokens[:first]:
        if token.lower() not in _KEY_COLUMNS:
            raise CalibrationError(f"{where}: unknown column {token!r} before 'time' in the column header; "
                                   f"known key columns are {sorted(set(_KEY_COLUMNS))}")
        keys.append(_KEY_COLUMNS[token.lower()])
    rest = tokens[first:]
    if len(rest) not in (4, 8) or rest[0] != "time" or (len(rest) == 8 and rest[4] != "time"):
        raise CalibrationError(f"{where}: expected 'time algbw busbw error' once or twice after the key "
                               f"columns, but got {rest}")
    check = "wrong" if rest[3].lower().lstrip("#") == "wrong" else "error"
    return keys + ["time", "algbw", "busbw", check] + (["ip_time", "ip_algbw", "ip_busbw", f"ip_{check}"]
                                                       if len(rest) == 8 else [])


def _number(token: str, kind: type, what: str, where: str, optional: bool = False):
    if optional and token.upper() == "N/A":
        return None
    try:
        return kind(token)
    except ValueError:
        raise CalibrationError(f"{where}: {what} must be a number, but got {token!r}") from None


def _wrong_count(values: dict) -> str | None:
    """Why a row is refused: nccl-tests' ``#wrong`` column counts wrong results (0 = correct)."""
    for key, phase in (("wrong", "out-of-place"), ("ip_wrong", "in-place")):
        token = values.get(key)
        if token is not None and token.upper() != "N/A" and token != "0":
            return f"#wrong = {token} ({phase}): nccl-tests found wrong results, the timing is not trusted"
    return None


def _parse_row(tokens: list[str], columns: list[str], line_no: int, where: str,
               last_line: bool = False) -> NcclTestsRow:
    if len(tokens) != len(columns):
        names = " ".join(c.removeprefix("ip_") for c in columns)
        what = ("truncated result row (the log was cut off)" if last_line and len(tokens) < len(columns)
                else "result row with the wrong number of columns")
        raise CalibrationError(f"{where}: {what}: needs {len(columns)} columns ({names}), but got "
                               f"{len(tokens)}: {' '.join(tokens)!r}; remove the line or rerun the test")
    values = dict(zip(columns, tokens))
    ip = "ip_time" in values

    def num(key: str, kind: type = float, optional: bool = False):
        return _number(values[key], kind, key, where, optional) if key in values else None

    row = NcclTestsRow(
        line=line_no, size_bytes=num("size", int), count=num("count", int), dtype=values.get("type", "?"),
        redop=values.get("redop"), root=num("root", int), time_us=num("time"), algbw_gbyte_s=num("algbw"),
        busbw_gbyte_s=num("busbw"), in_place_time_us=num("ip_time", optional=True) if ip else None,
        in_place_algbw_gbyte_s=num("ip_algbw", optional=True) if ip else None,
        in_place_busbw_gbyte_s=num("ip_busbw", optional=True) if ip else None)
    measured = [x for x in (row.time_us, row.algbw_gbyte_s, row.busbw_gbyte_s, row.in_place_time_us,
                            row.in_place_algbw_gbyte_s, row.in_place_busbw_gbyte_s) if x is not None]
    if not all(math.isfinite(x) and x >= 0 for x in measured):  # nan, inf: issue 10
        raise CalibrationError(f"{where}: times and bandwidths must be finite numbers >= 0, but got "
                               f"{' '.join(tokens)!r}; remove the line or rerun the test")
    if row.size_bytes < 0 or row.time_us <= 0 or (row.count is not None and row.count < 0):
        raise CalibrationError(f"{where}: `size >= 0 and count >= 0 and time > 0` must hold, but got "
                               f"(size={row.size_bytes}, count={row.count}, time={row.time_us}); remove the line "
                               f"or rerun the test")
    return row


@dataclass
class _State:
    columns: list[str] | None = None
    ranks: list[RankInfo] = field(default_factory=list)
    rows: list[NcclTestsRow] = field(default_factory=list)
    header: dict = field(default_factory=dict)
    ignored: list[tuple[int, str]] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    closed: bool = False
    avg_busbw: float | None = None
    started: str | None = None


def _header_line(text: str, state: _State, where: str) -> None:
    body = text.lstrip("#").split()
    rank = _RANK_LINE.match(text)
    if rank:
        state.ranks.append(RankInfo(rank=int(rank.group(1)), pid=int(rank.group(2)), host=rank.group(3),
                                    device=int(rank.group(4)), gpu_name=rank.group(5).strip()))
    elif body and body[0].lower() in ("size", "bytes") and "time" in body:
        state.columns = _column_layout(body, where)
    elif body[:1] == ["nThread"]:
        state.header.update(dict(zip(body[0::2], body[1::2])))
    elif (match := _START_LINE.match(text)) is not None:
        state.started = match.group(1)
    elif (match := _AVG_LINE.match(text)) is not None:
        state.avg_busbw = float(match.group(1))
        state.closed = True
    elif body[:3] == ["Out", "of", "bounds"]:
        state.closed = True


def _scan(lines: list[str], path: str) -> _State:
    state = _State()
    last = max((i for i, line in enumerate(lines, start=1) if line.strip()), default=0)
    for line_no, raw in enumerate(lines, start=1):
        text, from_stderr = _strip_prefix(raw.rstrip("\n"))
        where = f"{path} line {line_no}"
        stripped = text.strip()
        if from_stderr:
            state.ignored.append((line_no, "MPI stderr line"))
        elif not stripped:
            continue
        elif stripped.startswith("#"):
            _header_line(stripped, state, where)
        elif _NCCL_DEBUG.search(stripped):
            state.ignored.append((line_no, "NCCL debug line"))
        elif stripped[0].isdigit():
            if state.columns is None:
                raise CalibrationError(f"{where}: result row before the '# size count type ...' column header; "
                                       f"the log is truncated or not nccl-tests output")
            tokens = stripped.split()
            row = _parse_row(tokens, state.columns, line_no, where, last_line=line_no == last)
            reason = _wrong_count(dict(zip(state.columns, tokens)))
            if reason:
                state.refused.append((line_no, reason))
            else:
                state.rows.append(row)
        else:
            raise CalibrationError(f"{where}: cannot read {stripped[:60]!r} as a result row or a '#' header "
                                   f"line; remove it or comment it out with '#'")
    return state


def _check_bus_factor(log: NcclTestsLog) -> None:
    """busbw / algbw must match the collective and the GPU count the header names."""
    factor = bus_factor(log.collective, log.num_gpus) if log.collective != "reduce" else 1.0
    for row in log.rows:
        if row.algbw_gbyte_s >= 1.0 and abs(row.busbw_gbyte_s - factor * row.algbw_gbyte_s) > \
                0.02 + 0.02 * row.busbw_gbyte_s:
            raise CalibrationError(
                f"{log.path} line {row.line}: `busbw / algbw == {factor:.4g}` must hold for {log.collective} over "
                f"{log.num_gpus} GPUs, but got (busbw={row.busbw_gbyte_s}, algbw={row.algbw_gbyte_s}); the "
                f"file holds another collective or GPU count: name the collective or fix the header")


def _unique_ranks(ranks: list[RankInfo], path: str) -> tuple[RankInfo, ...]:
    """Rank lines once each (a log of several runs repeats them); conflicting repeats are an error."""
    by_rank: dict[int, RankInfo] = {}
    for info in ranks:
        seen = by_rank.setdefault(info.rank, info)
        if (seen.host, seen.device) != (info.host, info.device):
            raise CalibrationError(f"{path}: rank {info.rank} is listed on {seen.host} device {seen.device} and on "
                                   f"{info.host} device {info.device}; split the log into one file per run")
    return tuple(by_rank[r] for r in sorted(by_rank))


def parse_nccl_tests(path: str | Path, collective: str | None = None) -> NcclTestsLog:
    """Parse one nccl-tests log; ``collective`` defaults to what the log or its file name says."""
    path = Path(path)
    if not path.is_file():
        raise CalibrationError(f"nccl-tests log {str(path)!r} does not exist; give the path of a saved "
                               f"all_reduce_perf (or other *_perf) output")
    state = _scan(path.read_text(errors="replace").splitlines(), str(path))
    name = collective or (collective_from_name(state.started) if state.started else None) \
        or collective_from_name(path.name)
    if name is None:
        raise CalibrationError(f"{path}: cannot tell which collective the log measures; name the file after "
                               f"it (e.g. all_gather_8gpu.log) or pass the collective explicitly")
    name = COLLECTIVE_ALIASES.get(re.sub(r"[^a-z]", "", name.lower()), name)
    if not state.ranks:
        raise CalibrationError(f"{path}: no '#  Rank N Pid P on HOST device D' header lines; the GPU count "
                               f"and node layout come from them, so keep the whole nccl-tests header")
    if not state.rows:
        raise CalibrationError(f"{path}: no usable result rows under the column header "
                               f"({len(state.refused)} refused for #wrong != 0)")
    ranks = _unique_ranks(state.ranks, str(path))

    check_rank_numbers(ranks, str(path))
    _check_hosts(ranks, str(path))
    log = NcclTestsLog(path=str(path), collective=name, ranks=ranks, rows=tuple(state.rows),
                       header=state.header, avg_busbw_gbyte_s=state.avg_busbw, ignored_lines=tuple(state.ignored),
                       refused_rows=tuple(state.refused), warnings=tuple(_table_warnings(state, str(path))))
    check_single_run(log)
    _check_bus_factor(log)  # the ratio names the wrong collective where it can; the table layout after it
    check_rows_match_collective(log)
    return log


def _check_hosts(ranks: tuple[RankInfo, ...], path: str) -> None:
    """Every host holds the same number of ranks (a torn host name would show up as an odd host)."""
    counts = Counter(r.host for r in ranks)
    if len(set(counts.values())) > 1:
        common = Counter(counts.values()).most_common(1)[0][0]
        odd = ", ".join(f"{host}: {n}" for host, n in sorted(counts.items()) if n != common)
        raise CalibrationError(f"{path}: `every host runs the same number of ranks` must hold, but {len(ranks)} ranks "
                               f"sit on {len(counts)} hosts, most with {common} and ({odd}); fix the host names "
                               f"in the '# Rank' lines (an interleaved or cut line?)")


def _table_warnings(state: _State, path: str) -> list[str]:
    max_bytes = state.header.get("maxBytes")
    last = state.rows[-1]
    if state.closed or max_bytes is None or not max_bytes.isdigit() or last.size_bytes >= int(max_bytes):
        return []
    return [f"{path}: the table stops at line {last.line} (size {last.size_bytes}) before maxBytes {max_bytes} "
            f"without the closing '# Avg bus bandwidth' line: the log is truncated"]
