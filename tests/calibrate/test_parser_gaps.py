"""nccl-tests logs that used to be mis-read silently (issue 10): a missing `# Rank` line, NaN/inf times,
two runs appended in one file, a file name naming another collective than its rows; and property
tests: any mangled log is parsed or refused with a CalibrationError, never another exception."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from echo_tune.calibrate.logs.nccl_tests import parse_nccl_tests
from echo_tune.errors import CalibrationError

from .conftest import LOGS
from .test_log_hardening import CLOSING, HEADER_2, ROWS_2


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_clean_log_parses(tmp_path):
    log = parse_nccl_tests(_write(tmp_path, "all_reduce_2gpu.log", HEADER_2 + "\n".join(ROWS_2) + "\n" + CLOSING))
    assert log.num_gpus == 2 and len(log.rows) == 3


def test_missing_rank_line_is_refused(tmp_path):
    lines = LOGS[16].read_text().splitlines()
    rank_lines = [i for i, line in enumerate(lines) if "Rank  3 " in line or "Rank 3 " in line]
    assert rank_lines, "the 16-GPU log lists rank 3"
    del lines[rank_lines[0]]
    path = _write(tmp_path, "all_reduce_16gpu.log", "\n".join(lines) + "\n")
    with pytest.raises(CalibrationError, match=r"ranks \[3\] are missing"):
        parse_nccl_tests(path)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf", "NaN"])
def test_nan_or_inf_times_are_refused(tmp_path, bad):
    row = ROWS_2[1].split()
    row[5] = bad  # out-of-place time
    rows = [ROWS_2[0], "  ".join(row), ROWS_2[2]]
    path = _write(tmp_path, "all_reduce_2gpu.log", HEADER_2 + "\n".join(rows) + "\n" + CLOSING)
    with pytest.raises(CalibrationError, match="finite numbers"):
        parse_nccl_tests(path)


def test_two_appended_runs_are_refused(tmp_path):
    one = HEADER_2 + "\n".join(ROWS_2) + "\n" + CLOSING
    path = _write(tmp_path, "all_reduce_2gpu.log", one + one)
    with pytest.raises(CalibrationError, match="several runs"):
        parse_nccl_tests(path)


def test_file_name_naming_another_collective_is_refused(tmp_path):
    # all_reduce output (root -1) saved as reduce_2gpu.log: on 2 GPUs busbw/algbw is 1 for both, so only
    # the root column tells them apart
    path = _write(tmp_path, "reduce_2gpu.log", HEADER_2 + "\n".join(ROWS_2) + "\n" + CLOSING)
    with pytest.raises(CalibrationError, match="read as reduce, but its rows have root -1"):
        parse_nccl_tests(path)
    none_rows = [r.replace(" sum ", " none ") for r in ROWS_2]
    path = _write(tmp_path, "all_reduce_2gpu.log", HEADER_2 + "\n".join(none_rows) + "\n" + CLOSING)
    with pytest.raises(CalibrationError, match="redop 'none'"):
        parse_nccl_tests(path)


_TOKEN = st.one_of(st.sampled_from(["nan", "inf", "-1", "0", "N/A", "", "sum", "none", "1e400", "#", "x"]),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.integers(-10**12, 10**12).map(str), st.text(max_size=6))


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(row=st.integers(0, 2), column=st.integers(0, 12), token=_TOKEN, drop_line=st.integers(-1, 12))
def test_mangled_logs_parse_or_refuse(tmp_path, row, column, token, drop_line):
    rows = [r.split() for r in ROWS_2]
    rows[row][column] = token
    text = HEADER_2 + "\n".join("  ".join(r) for r in rows) + "\n" + CLOSING
    lines = text.splitlines()
    if 0 <= drop_line < len(lines):
        del lines[drop_line]
    path = _write(tmp_path, "all_reduce_2gpu.log", "\n".join(lines) + "\n")
    try:
        log = parse_nccl_tests(path)
    except CalibrationError as exc:
        assert "\n" not in str(exc)
        return
    import math
    assert log.num_gpus == 2  # a log it accepts has both ranks and finite, positive times
    assert all(math.isfinite(r.time_us) and r.time_us > 0 and math.isfinite(r.busbw_gbyte_s) for r in log.rows)
