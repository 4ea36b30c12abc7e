"""`echo-tune profile` and `echo-tune emulate` from the command line (small model, CPU)."""

import json
from pathlib import Path

import pytest
import torch

from echo_tune.cli.main import main

DATA = Path(__file__).parents[1] / "data"
SMALL = ["--model", str(DATA / "tiny-llama.yaml"), "--cluster", str(DATA / "cpu-cluster.yaml"), "--num-gpus", "2",
         "--tensor-model-parallel-size", "2", "--global-batch-size", "2", "--fp32", "--seq-length", "64",
         "--hidden-size", "64", "--ffn-hidden-size", "128", "--threads", "1"]


def test_profile_then_simulate_and_emulate_json(tmp_path, monkeypatch, capsys):
    threads = torch.get_num_threads()
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["profile", *SMALL, "--json", "--quiet"]) == 0
        first = json.loads(capsys.readouterr().out)
        assert first["measured"] == first["ops"] > 0 and first["already_measured"] == 0
        assert Path(first["db"]).is_file() and first["db"] == "calibration/cpu-cluster/optime.sqlite"
        assert main(["profile", *SMALL, "--json", "--quiet"]) == 0  # a second run finds everything measured
        again = json.loads(capsys.readouterr().out)
        assert again["measured"] == 0 and again["already_measured"] == first["ops"]
        profile = first["profile"]
        sim_args = [a for a in SMALL if a not in ("--threads", "1")]
        assert main(["simulate", *sim_args, "--profile", profile, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["measured_compute_share"] >= 0.95
        assert main(["emulate", *SMALL, "--profile", profile, "--repeats", "1", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert set(out["emulated_s"]) == set(out["simulated_s"]) and out["task_order"] == ["F0", "B0", "F1", "B1"]
        assert main(["emulate", *SMALL, "--profile", profile, "--repeats", "1"]) == 0
        assert "stage step" in capsys.readouterr().out
    finally:
        torch.set_num_threads(threads)


def test_profile_without_targets_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["profile", "--model", "gpt-1.7b"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "search-space or rank file" in err


def test_space_with_layout_flags_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["profile", str(DATA / "tiny-space.yaml"), "--num-gpus", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--num-gpus" in err


def test_profile_a_rank_file_and_refuse_mixed_gpus(tmp_path, monkeypatch, capsys):
    threads = torch.get_num_threads()
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["profile", str(DATA / "tiny-rank.yaml"), "--threads", "1", "--quiet", "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["measured"] == out["ops"] > 0
    finally:
        torch.set_num_threads(threads)
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text((DATA / "tiny-rank.yaml").read_text().replace("cluster: cpu-cluster.yaml",
                                                                  f"cluster: {DATA / 'cpu-cluster.yaml'}")
                     + "  - name: on H100\n    cluster: h100-sxm\n    layout: {tensor_model_parallel_size: 2}\n")
    mixed_model = mixed.read_text().replace("model: tiny-llama.yaml", f"model: {DATA / 'tiny-llama.yaml'}")
    mixed.write_text(mixed_model)
    assert main(["profile", str(mixed)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "h100-sxm" in err


def test_what_profile_writes_is_not_under_version_control():
    """`profile` writes calibration/<cluster>/optime.sqlite and profile-optime.yaml: machine-specific, generated
    files that git ignores, so a profile run never edits a tracked file."""
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        pytest.skip("not a git checkout")
    tracked = subprocess.run(["git", "ls-files", "calibration"], cwd=repo, capture_output=True, text=True,
                             check=True).stdout.split()
    assert not [p for p in tracked if p.endswith(("profile-optime.yaml", "optime.sqlite"))]
    for path in ("calibration/cpu-cluster/profile-optime.yaml", "calibration/h100-sxm/optime.sqlite"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=repo).returncode == 0, path
