"""The nccl-tests parser on the logs real runs write: interleaved mpirun output, #wrong rows, cut tables,
logs of another GPU or node layout; and the guard-rails of `calibrate check` and `calibrate fit`."""

from __future__ import annotations

import pytest

from echo_tune.calibrate.fit.fit_profile import fit_profile
from echo_tune.calibrate.logs.log_checks import check_log_for_cluster, gpu_mismatch
from echo_tune.calibrate.logs.nccl_tests import parse_nccl_tests
from echo_tune.cli.main import main
from echo_tune.config.load.loading import load_cluster
from echo_tune.errors import CalibrationError

from .conftest import A100_DIR, LOGS

HELDOUT_128 = A100_DIR / "nccl-tests-heldout" / "all_reduce_128gpu.log"
CLUSTER = str(A100_DIR / "cluster.yaml")

HEADER_2 = """# nThread 1 nGpus 1 minBytes 1024 maxBytes 4194304 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#  Rank  0 Group  0 Pid   6899 on host-a device  0 [0000:04:00] NVIDIA A100-SXM4-40GB
#  Rank  1 Group  0 Pid   6733 on host-a device  1 [0000:04:00] NVIDIA A100-SXM4-40GB
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""
ROWS_2 = [
    "        1024           256     float     sum      -1    10.00    0.10    0.10      0    10.00    0.10    0.10      0",
    "     1048576        262144     float     sum      -1    20.00   52.43   52.43      0    20.00   52.43   52.43      0",
    "     4194304       1048576     float     sum      -1    50.00   83.89   83.89      0    50.00   83.89   83.89      0",
]
CLOSING = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 45.4\n#\n"


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_interleaved_mpirun_line_in_a_real_128_gpu_log():
    # line 56 reads "... on node-[1,0]<stdout>:00000C device  4 ...": read as 17 hosts before the fix
    assert "node-[1,0]<stdout>:00000C" in HELDOUT_128.read_text().splitlines()[55]
    log = parse_nccl_tests(HELDOUT_128)
    assert (log.num_gpus, log.num_nodes, log.ranks_per_node) == (128, 16, 8)
    assert "node-00000C" in log.hosts and len(log.rows) == 23


def test_mpi_tags_anywhere_and_a_torn_host_name_is_refused(tmp_path):
    lines = LOGS[16].read_text().splitlines()
    # a tag in the middle of a rank line (interleaved output) is removed ...
    lines[12] = lines[12].replace("on node-000002", "on node-[1,0]<stdout>:000002")
    log = parse_nccl_tests(_write(tmp_path, "all_reduce_16gpu.log", "\n".join(lines)))
    assert log.num_nodes == 2 and log.ranks_per_node == 8
    # ... but a host name torn apart by another rank's output makes an odd host: refused, by name
    lines[12] = lines[12].replace("on node-[1,0]<stdout>:000002", "on node-0000")
    with pytest.raises(CalibrationError, match=r"every host runs the same number of ranks.*node-0000: 1"):
        parse_nccl_tests(_write(tmp_path, "all_reduce_16gpu.log", "\n".join(lines)))


def test_wrong_row_is_refused_and_reported(tmp_path):
    bad = ROWS_2[1].replace("52.43      0    20.00", "52.43      3    20.00")
    path = _write(tmp_path, "all_reduce_2gpu.log", HEADER_2 + "\n".join([ROWS_2[0], bad, ROWS_2[2]]) + "\n" + CLOSING)
    log = parse_nccl_tests(path)
    assert [row.size_bytes for row in log.rows] == [1024, 4194304]
    assert log.refused_rows == ((11, "#wrong = 3 (out-of-place): nccl-tests found wrong results, the timing is "
                                     "not trusted"),)
    outcome = fit_profile(load_cluster(CLUSTER), nccl_logs=[path])
    assert any("line 11: row refused: #wrong = 3" in w for w in outcome.warnings)


def test_truncated_row_names_its_line(tmp_path):
    cut = ROWS_2[2][:60]
    path = _write(tmp_path, "all_reduce_2gpu.log", HEADER_2 + "\n".join([ROWS_2[0], ROWS_2[1], cut]) + "\n")
    with pytest.raises(CalibrationError) as info:
        parse_nccl_tests(path)
    message = str(info.value)
    assert "line 12: truncated result row (the log was cut off)" in message and "\n" not in message


def test_table_that_stops_early_warns(tmp_path):
    path = _write(tmp_path, "all_reduce_2gpu.log", HEADER_2 + "\n".join(ROWS_2[:2]) + "\n")
    log = parse_nccl_tests(path)
    assert len(log.rows) == 2
    assert log.warnings == (f"{path}: the table stops at line 11 (size 1048576) before maxBytes 4194304 without "
                            f"the closing '# Avg bus bandwidth' line: the log is truncated",)
    complete = parse_nccl_tests(_write(tmp_path, "all_reduce_2gpu_full.log", HEADER_2 + "\n".join(ROWS_2) + "\n"
                                       + CLOSING))
    assert complete.warnings == ()


@pytest.mark.parametrize(("log_gpu", "cluster_gpu", "ok"), [
    ("A100-SXM4-40GB", "a100-40gb", True), ("NVIDIA A100-SXM4-80GB", "a100-80gb", True),
    ("NVIDIA H100 80GB HBM3", "h100-sxm", True), ("NVIDIA H800", "h800-sxm", True),
    ("A100-SXM4-40GB", "a100-80gb", False), ("A100-SXM4-40GB", "h100-sxm", False),
    ("NVIDIA H100 80GB HBM3", "h200-sxm", False)])
def test_gpu_names(log_gpu, cluster_gpu, ok):
    assert (gpu_mismatch(log_gpu, cluster_gpu) is None) == ok


def test_gpu_mismatch_is_refused_unless_allowed(tmp_path, capsys):
    out = str(tmp_path / "p.yaml")
    args = ["calibrate", "fit", "--cluster", "h100-sxm", "--nccl-tests", str(LOGS[8]), "--out", out]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "the log's GPU 'A100-SXM4-40GB' is not the cluster's 'h100-sxm'" in err and err.count("\n") == 1
    assert main(args + ["--allow-gpu-mismatch"]) == 0
    assert "allowed by --allow-gpu-mismatch" in capsys.readouterr().err
    assert main(["calibrate", "check", "--cluster", "h100-sxm", "--profile", out, "--nccl-tests", str(LOGS[8])]) == 2


def test_node_layout_cross_checked_with_gpus_per_node(tmp_path):
    log = parse_nccl_tests(LOGS[16])
    four_per_node = load_cluster(CLUSTER).replace(gpus_per_node=4)
    with pytest.raises(CalibrationError, match=r"ranks per host <= gpus_per_node.*ranks per host=8, gpus_per_node=4"):
        check_log_for_cluster(log, four_per_node)
    # 2 ranks on each of 2 hosts of an 8-GPU cluster: hosts not full, a warning
    text = HEADER_2.replace("#  Rank  1 Group  0 Pid   6733 on host-a", "#  Rank  1 Group  0 Pid   6733 on host-b")
    path = _write(tmp_path, "all_reduce_2gpu.log", text + "\n".join(ROWS_2) + "\n" + CLOSING)
    warnings = check_log_for_cluster(parse_nccl_tests(path), load_cluster(CLUSTER))
    assert len(warnings) == 1 and "2 ranks on 2 hosts where 1 node(s) of 8 GPUs would hold them" in warnings[0]


def test_check_max_error_pct_exit_codes(capsys):
    base = ["calibrate", "check", "--cluster", CLUSTER, "--profile", str(A100_DIR / "profile-1node.yaml"),
            "--nccl-tests", str(LOGS[16])]
    assert main(base) == 0
    assert main(base + ["--max-error-pct", "5"]) == 1
    err = capsys.readouterr().err
    assert "off by" in err and "more than --max-error-pct 5" in err
    assert main(base + ["--max-error-pct", "40"]) == 0
    assert main(base + ["--max-error-pct", "-1"]) == 2


def test_a_cluster_gpu_without_a_model_name_gets_a_warning_not_silence():
    # an A100 log against a cluster whose GPU is named "cpu-test": no model to compare, and nothing was said
    log = parse_nccl_tests(LOGS[8])
    cluster = load_cluster(CLUSTER)
    unnamed = cluster.replace(gpu=cluster.gpu.replace(name="my-accelerator"))
    warnings = check_log_for_cluster(log, unnamed)
    assert any("names no GPU model to check it against" in w and "A100" in w for w in warnings)
    assert not any("names no GPU model" in w for w in check_log_for_cluster(log, cluster))
