"""`echo-tune calibrate fit|check|predict` output and one-line errors."""

from __future__ import annotations

import json

from echo_tune.cli.main import main

from .conftest import A100_DIR, LOGS

CLUSTER = str(A100_DIR / "cluster.yaml")


def test_check_json_layout(capsys):
    assert main(["calibrate", "check", "--cluster", CLUSTER, "--profile", str(A100_DIR / "profile-1node.yaml"),
                 "--nccl-tests", str(LOGS[16]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data) == ["collective", "num_gpus", "num_nodes", "points", "warnings"]
    assert (data["collective"], data["num_gpus"], data["num_nodes"]) == ("all_reduce", 16, 2)
    assert list(data["points"][0]) == ["size_bytes", "predicted_time_us", "measured_time_us"]
    assert len(data["points"]) == 25 and data["points"][0]["measured_time_us"] == 34.66


def test_check_table_reports_the_error_from_1mib(capsys):
    assert main(["calibrate", "check", "--cluster", CLUSTER, "--profile", str(A100_DIR / "profile-1node.yaml"),
                 "--nccl-tests", str(LOGS[16])]) == 0
    captured = capsys.readouterr()
    assert "max |error| from 1 MiB up" in captured.out and "17179869184" in captured.out
    assert "extrapolates to 2 nodes" in captured.err


def test_fit_writes_profile_residuals_and_table(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "fit", "--cluster", CLUSTER, "--nccl-tests", str(LOGS[2]), str(LOGS[4]),
                 "--max-tiers", "1", "--out", str(out), "--show-points"]) == 0
    captured = capsys.readouterr()
    assert "fit quality" in captured.out and "residual per point" in captured.out
    assert "derived from the datasheet NIC rate" in captured.err
    rows = (tmp_path / "p.residuals.csv").read_text().splitlines()
    assert rows[0].startswith("quantity,source,point") and len(rows) == 1 + 56


def test_fit_json(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    assert main(["calibrate", "fit", "--cluster", CLUSTER, "--nccl-tests", str(LOGS[2]), str(LOGS[4]),
                 "--max-tiers", "1", "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["profile"] == str(out) and out.is_file() and data["residuals"].endswith(".residuals.csv")
    assert sum(f["points"] for f in data["fits"]) == 56 and all("rms_relative_error" in f for f in data["fits"])


def test_predict_many_nodes(capsys):
    assert main(["calibrate", "predict", "--cluster", CLUSTER, "--num-gpus", "16", "128", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["num_nodes"] for d in data] == [2, 16]


def test_errors_are_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "all_reduce_8gpu.log"
    bad.write_text(LOGS[8].read_text().replace("   1048576        262144", "   1048576", 1))
    assert main(["calibrate", "check", "--cluster", CLUSTER, "--nccl-tests", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 33: result row with the wrong number of columns: needs 12 columns" in err
    assert main(["calibrate", "fit", "--cluster", CLUSTER, "--out", str(tmp_path / "x.yaml")]) == 2
    assert "nothing to fit" in capsys.readouterr().err
    assert main(["calibrate", "check", "--cluster", CLUSTER, "--nccl-tests", str(LOGS[1])]) == 2
    assert "1-GPU log moves no data" in capsys.readouterr().err


def test_fit_to_standard_output_writes_no_residuals_file_beside_it(tmp_path, monkeypatch, capsys):
    """`--out -` streams the profile; there is no "beside" a stream for the residuals (it once wrote
    '-.residuals.csv' in the working folder, and /dev/stdout.residuals.csv into /dev as root)."""
    monkeypatch.chdir(tmp_path)
    assert main(["calibrate", "fit", "--cluster", CLUSTER, "--nccl-tests", str(LOGS[2]), str(LOGS[4]),
                 "--max-tiers", "1", "--out", "-"]) == 0
    out = capsys.readouterr().out
    assert "no residuals file beside a stream" in out and "bus_bandwidth_gbyte_s" in out
    assert list(tmp_path.iterdir()) == []
