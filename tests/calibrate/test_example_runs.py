"""The no-GPU calibration path of the README (a runs CSV -> calibrate fit --runs -> simulate --profile), and what
`calibrate fit --runs` says about leave-one-source-out where no source can be refitted."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.calibrate_runs import loso_note, unfitted_sources
from echo_tune.cli.main import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "calibration" / "example-runs"


def _readme_calibrate_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## 2. Calibrate"):text.index("## 3.")]
    block = re.findall(r"^```bash\n(.*?)^```", section, flags=re.M | re.S)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.split(" #")[0].strip() for line in joined.splitlines() if line.startswith("echo-tune")]


@pytest.fixture()
def scratch(tmp_path, monkeypatch):
    (tmp_path / "calibration").symlink_to(REPO / "calibration")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_fit_then_simulate_with_the_profile_it_wrote(scratch, capsys):
    fit, sim = _readme_calibrate_commands()
    assert "calibrate fit --runs calibration/example-runs/h100-llama-runs.csv" in fit
    assert main(shlex.split(fit)[1:]) == 0
    out = capsys.readouterr().out
    written = scratch / shlex.split(fit)[shlex.split(fit).index("--out") + 1]
    assert "fitted on runs: NVIDIA-NeMo/Megatron-Bridge" in written.read_text()
    assert "leave-one-source-out not shown: all rows come from one source" in out
    assert "leave-source-out" not in out  # the column is hidden: it would be the unfitted prediction
    # the README simulates with the shipped copy of that profile; the one just written works the same way
    shipped = sim.split("--profile ")[1].split()[0]
    argv = shlex.split(sim)[1:]
    for profile in (shipped, str(written)):
        argv[argv.index("--profile") + 1] = profile
        assert main(argv + ["--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert "fitted on runs: NVIDIA-NeMo/Megatron-Bridge" in json.dumps(report)


def test_the_shipped_profile_is_what_the_readme_command_writes(scratch, capsys):
    fit, _ = _readme_calibrate_commands()
    shipped = yaml.safe_load((EXAMPLE / "h100-llama-runs-fit.yaml").read_text())
    assert shipped["fitted"]["command"] == fit
    assert main(shlex.split(fit)[1:] + ["--json"]) == 0
    refit = json.loads(capsys.readouterr().out)["params"]
    stale = ("calibration/example-runs/h100-llama-runs-fit.yaml is stale: rerun the README's command in a folder "
             "with calibration/ beside it and copy my-runs-fit.yaml over it")
    for name, value in shipped["fitted"]["params"].items():  # within 10%: the simulator moves a little over time
        assert refit[name] == pytest.approx(value, rel=0.10), f"{name}: {stale}"


def _rows(keys):
    return [{"name": f"r{i}", "source_key": k} for i, k in enumerate(keys)]


def test_loso_note_one_source():
    rows = _rows(["paper"] * 6)
    assert unfitted_sources(rows, 3) == {"paper": 0}
    note = loso_note(rows, 3, 4.25)
    assert note.startswith("leave-one-source-out not shown: all rows come from one source ('paper'")
    assert "unfitted prediction (MAPE 4.2%)" in note


def test_loso_note_one_row_per_source():
    """Five sources of one row each and three parameters: holding one out leaves 4 rows, fewer than 5."""
    rows = _rows(["a", "b", "c", "d", "e"])
    assert unfitted_sources(rows, 3) == {k: 4 for k in "abcde"}
    assert "leaves at most 4 rows of the others, fewer than the 5 a fit of 3 parameter(s) needs" in \
        loso_note(rows, 3, 2.0)
    assert loso_note(_rows(["a", "b", "c", "d", "e", "f"]), 3, 2.0) is None  # 5 rows left: refitted


def test_loso_note_marks_the_sources_that_cannot_be_refitted():
    rows = _rows(["big"] * 5 + ["small"])
    assert unfitted_sources(rows, 2) == {"big": 1}
    assert loso_note(rows, 2, 1.0) == ("leave-source-out marked '*' is the unfitted prediction: holding out big "
                                       "leaves fewer than the 4 rows a fit of 2 parameter(s) needs")


def test_fit_on_published_gpt_rows_warns_of_the_defaults_they_take(tmp_path, capsys):
    runs = REPO / "calibration" / "published-runs" / "runs_megatron.csv"
    assert main(["calibrate", "fit", "--runs", str(runs), "--gpu", "a100-80gb", "--out", str(tmp_path / "p.yaml")]) == 0
    captured = capsys.readouterr()
    assert "take Megatron's GPT-3 defaults for --normalization LayerNorm" in captured.err
    assert "add a `model` column" in captured.err
