"""The nccl-tests parser on the real A100 logs and on every layout variant nccl-tests prints."""

from __future__ import annotations

import pytest

from echo_tune.calibrate.logs.nccl_tests import collective_from_name, parse_nccl_tests
from echo_tune.errors import CalibrationError

from .conftest import LOGS

RANKS_2 = """# nThread 1 nGpus 1 minBytes 8 maxBytes 128 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#  Rank  0 Group  0 Pid   6899 on host-a device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid   6733 on host-b device  0 [0000:04:00] NVIDIA H100 80GB HBM3
#
"""


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_real_logs_layout(n):
    log = parse_nccl_tests(LOGS[n])
    assert log.collective == "all_reduce"
    assert log.num_gpus == n
    assert log.num_nodes == (2 if n == 16 else 1)
    assert log.ranks_per_node == min(n, 8)
    assert log.gpu_name == "A100-SXM4-40GB"
    assert len(log.rows) == (25 if n == 16 else 28)
    assert log.ignored_lines == ()


def test_mpi_prefixed_16gpu_values():
    log = parse_nccl_tests(LOGS[16])
    first, last = log.rows[0], log.rows[-1]
    assert (first.size_bytes, first.time_us, first.in_place_time_us) == (1024, 34.66, 34.47)
    assert (last.size_bytes, last.busbw_gbyte_s, last.in_place_busbw_gbyte_s) == (17179869184, 127.95, 128.50)
    assert log.hosts == ["node-000000", "node-000002"]
    assert log.avg_busbw_gbyte_s == pytest.approx(60.5716)


def test_root_column_wrong_column_group_and_srun_prefix(tmp_path):
    text = RANKS_2 + """#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
0:          64            16     float    none      -1    10.00    0.01    0.00      0    10.10    0.01    0.00      0
0:     1048576        262144     float    none      -1    100.0   10.49    5.24      0    101.0   10.38    5.19      0
# Out of bounds values : 0 OK
"""
    log = parse_nccl_tests(_write(tmp_path, "all_gather_perf.log", text))
    assert log.collective == "all_gather" and log.num_nodes == 2 and log.ranks_per_node == 1
    assert log.rows[1].root == -1 and log.rows[1].redop == "none" and log.rows[1].in_place_time_us == 101.0


def test_old_layout_without_redop_and_in_place_na(tmp_path):
    text = RANKS_2 + """#       size         count      type     time   algbw   busbw  error     time   algbw   busbw  error
        1024           256     float    20.00    0.05    0.03  0e+00      N/A     N/A     N/A    N/A
"""
    log = parse_nccl_tests(_write(tmp_path, "alltoall.log", text))
    assert log.collective == "all_to_all" and log.rows[0].redop is None and log.rows[0].in_place_time_us is None


def test_collective_from_header_line_wins(tmp_path):
    text = "# Collective test starting: sendrecv_perf\n" + RANKS_2 + \
        "#  size count type redop root time algbw busbw #wrong time algbw busbw #wrong\n" \
        "  1024 256 float sum -1 10.0 0.10 0.10 0 10.0 0.10 0.10 0\n"
    assert parse_nccl_tests(_write(tmp_path, "run.log", text)).collective == "send_recv"


@pytest.mark.parametrize("name, expected", [
    ("broadcast_perf", "broadcast"), ("reduce_scatter_8gpu.log", "reduce_scatter"),
    ("all_reduce_16gpu.log", "all_reduce"), ("reduce_perf", "reduce"), ("nothing.log", None)])
def test_collective_from_name(name, expected):
    assert collective_from_name(name) == expected


def test_debug_and_stderr_lines_are_counted_not_dropped(tmp_path):
    lines = LOGS[16].read_text().splitlines()
    lines.insert(3, "[1,0]<stderr>:node-000000:65741:65741 [0] NCCL INFO Bootstrap : Using eth0")
    lines.insert(5, "node-000000:65741:65741 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB")
    log = parse_nccl_tests(_write(tmp_path, "all_reduce_16gpu.log", "\n".join(lines)))
    assert [reason for _, reason in log.ignored_lines] == ["MPI stderr line", "NCCL debug line"]
    assert [line for line, _ in log.ignored_lines] == [4, 6]
    assert len(log.rows) == 25


def test_malformed_row_names_its_line(tmp_path):
    lines = LOGS[8].read_text().splitlines()
    lines[20] = lines[20].rsplit(maxsplit=1)[0]  # drop the last column
    with pytest.raises(CalibrationError, match=r"line 21: result row with the wrong number of columns: needs 12 columns"):
        parse_nccl_tests(_write(tmp_path, "all_reduce_8gpu.log", "\n".join(lines)))


def test_garbage_line_names_its_line(tmp_path):
    lines = LOGS[2].read_text().splitlines()
    lines.insert(12, "mpirun: some unexpected text")
    with pytest.raises(CalibrationError, match=r"line 13: cannot read 'mpirun"):
        parse_nccl_tests(_write(tmp_path, "all_reduce_2gpu.log", "\n".join(lines)))


def test_non_numeric_time(tmp_path):
    text = LOGS[2].read_text().replace("8.65", "abc", 1)
    with pytest.raises(CalibrationError, match=r"line 10: time must be a number, but got 'abc'"):
        parse_nccl_tests(_write(tmp_path, "all_reduce_2gpu.log", text))


def test_missing_rank_lines(tmp_path):
    text = "\n".join(l for l in LOGS[4].read_text().splitlines() if "Rank" not in l)
    with pytest.raises(CalibrationError, match="no '#  Rank N Pid P on HOST device D' header lines"):
        parse_nccl_tests(_write(tmp_path, "all_reduce_4gpu.log", text))


def test_wrong_collective_is_caught_by_busbw_ratio(tmp_path):
    path = _write(tmp_path, "all_gather_8gpu.log", LOGS[8].read_text())
    with pytest.raises(CalibrationError, match=r"`busbw / algbw == 0.875` must hold for all_gather over 8 GPUs"):
        parse_nccl_tests(path)


def test_unknown_collective_and_missing_file(tmp_path):
    with pytest.raises(CalibrationError, match="cannot tell which collective"):
        parse_nccl_tests(_write(tmp_path, "run.log", LOGS[2].read_text()))
    with pytest.raises(CalibrationError, match="does not exist"):
        parse_nccl_tests(tmp_path / "absent.log")


def test_row_before_header(tmp_path):
    with pytest.raises(CalibrationError, match="line 1: result row before"):
        parse_nccl_tests(_write(tmp_path, "all_reduce.log", "  1024 256 float sum 1.0 1.0 1.0 0\n"))
