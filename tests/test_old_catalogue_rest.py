"""The older bad-input catalogue's last silent answers (issue 41): an empty --study-name, a measured step of 1e-300 s,
duplicate run names in a runs file: each one line, exit 2."""

import csv

from echo_tune.cli.main import main
from echo_tune.validate.datasets import published_runs


def _one_line_exit_2(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def _rows(tmp_path, rows, name="runs.csv"):
    path = tmp_path / name
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=rows[0].keys())
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


def test_empty_study_name(tmp_path, capsys):
    err = _one_line_exit_2(capsys, ["search", "--model", "llama3-8b", "--cluster", "h100", "--num-gpus", "8",
                                    "--global-batch-size", "64", "--study-name", "", "--n-trials", "2",
                                    "--results-dir", str(tmp_path)])
    assert "`--study-name` must name the study" in err


def test_absurd_measured_step_and_duplicate_run_names(tmp_path, capsys):
    row = next(csv.DictReader(published_runs("runs_megatron.csv").open()))
    err = _one_line_exit_2(capsys, ["validate", _rows(tmp_path, [{**row, "measured_step_time_s": "1e-300"}])])
    assert "`0.001 <= measured_step_time_s <= 86400` must hold" in err
    err = _one_line_exit_2(capsys, ["validate", _rows(tmp_path, [row, row], "twice.csv")])
    assert "run names must be unique" in err and "lines 2 and 3" in err
