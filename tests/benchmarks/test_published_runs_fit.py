"""benchmarks/published_runs_fit.py: the --out path it records (the fit itself is not run here)."""

from pathlib import Path

from published_runs_fit import ROOT, shown_path


def test_a_path_inside_the_repository_is_recorded_relative_to_it():
    assert shown_path(ROOT / "calibration" / "published-runs-fit" / "h100.yaml") == \
        str(Path("calibration") / "published-runs-fit" / "h100.yaml")


def test_a_relative_path_is_resolved_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT / "calibration")
    assert shown_path(Path("fit") / "h100.yaml") == str(Path("calibration") / "fit" / "h100.yaml")
    monkeypatch.chdir(tmp_path)
    assert shown_path(Path("fit") / "h100.yaml") == str(tmp_path.resolve() / "fit" / "h100.yaml")


def test_a_path_outside_the_repository_is_recorded_absolute(tmp_path):
    outside = tmp_path.resolve() / "fit" / "a100.yaml"
    assert not outside.is_relative_to(ROOT)
    assert shown_path(outside) == str(outside)
