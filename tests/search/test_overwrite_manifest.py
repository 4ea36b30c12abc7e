"""Issue 41: ``search --overwrite`` removes only the files the study wrote (its manifest), and no link planted
in the results folder (the study folder, ``journal.log``, ``journal.log.flock``) is ever written through."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from echo_tune.errors import ConfigError
from echo_tune.search import SearchOptions, load_space, run_search

DATA = Path(__file__).resolve().parents[1] / "data"
MANIFEST_NAME = ".echo-tune-files.json"


def remove_written(study):
    from echo_tune.search.storage.manifest import remove_written

    return remove_written(study)


@pytest.fixture
def tiny(tmp_path):
    for name in ("tiny-space.yaml", "tiny-llama.yaml", "cpu-cluster.yaml"):
        shutil.copy(DATA / name, tmp_path / name)
    return tmp_path


def _search(root: Path, **kw):
    opts = SearchOptions(sampler="exhaustive", results_dir=root / "results", study_name="t", **kw)
    return run_search(load_space(root / "tiny-space.yaml"), opts)


def test_overwrite_keeps_the_users_own_files(tiny):
    first = _search(tiny)
    study = tiny / "results" / "t"
    written = set(json.loads((study / MANIFEST_NAME).read_text())["files"])
    assert {"journal.log", "trials.csv", "best.json", "megatron_args.txt"} <= written
    # the user's own notes, a CSV of theirs, a sub-folder of runs: every kind the old --overwrite deleted
    (study / "notes.txt").write_text("mine\n")
    (study / "measured.csv").write_text("a,b\n1,2\n")
    (study / "runs").mkdir()
    (study / "runs" / "log.json").write_text("{}\n")
    (study / "plot.svg").write_text("<svg/>\n")
    again = _search(tiny, overwrite=True)
    assert again.new_trials == first.n_trials  # started over
    assert (study / "notes.txt").read_text() == "mine\n" and (study / "measured.csv").exists()
    assert (study / "runs" / "log.json").read_text() == "{}\n" and (study / "plot.svg").exists()
    assert any("kept 4 of yours" in n and "notes.txt" in n and "runs/" in n for n in again.notes)
    assert (study / "trials.csv").exists() and (study / "best.json").exists()


def test_remove_written_without_a_manifest_removes_only_echo_tunes_names(tmp_path):
    """A study folder of an older version (no manifest): only the names a search writes go."""
    for name in ("journal.log", "trials.csv", "best.json", "mine.json", "mine.csv"):
        (tmp_path / name).write_text("x")
    (tmp_path / "best.json.d").mkdir()
    removed, kept = remove_written(tmp_path)
    assert removed == ["best.json", "journal.log", "trials.csv"]
    assert kept == ["best.json.d/", "mine.csv", "mine.json"]


def test_a_planted_manifest_cannot_reach_outside_the_folder(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious\n")
    study = tmp_path / "study"
    study.mkdir()
    (study / "sub").mkdir()
    (study / MANIFEST_NAME).write_text(json.dumps({"files": ["../outside.txt", "/etc/hostname", "sub", ".."]}))
    removed, kept = remove_written(study)
    assert outside.read_text() == "precious\n" and (study / "sub").is_dir()
    assert removed == [MANIFEST_NAME] and kept == ["sub/"]


def test_a_symlinked_study_folder_is_refused(tiny):
    elsewhere = tiny / "elsewhere"
    elsewhere.mkdir()
    (tiny / "results").mkdir()
    os.symlink(elsewhere, tiny / "results" / "t")
    with pytest.raises(ConfigError, match=r"study folder .*results/t' is a symbolic link") as info:
        _search(tiny)
    assert "\n" not in str(info.value) and list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("name", ["journal.log", "journal.log.flock"])
def test_a_planted_journal_link_is_refused(tiny, name):
    victim = tiny / "victim.txt"
    victim.write_text("precious\n")
    study = tiny / "results" / "t"
    study.mkdir(parents=True)
    os.symlink(victim, study / name)
    with pytest.raises(ConfigError, match=rf"{name}' is a symbolic link \(to .*victim.txt'\)"):
        _search(tiny)
    assert victim.read_text() == "precious\n"
    assert not (tiny / "victim.txt.flock").exists()  # the lock beside the link's target is not made either


def test_a_dangling_study_folder_link_is_refused(tiny):
    (tiny / "results").mkdir()
    os.symlink(tiny / "nowhere", tiny / "results" / "t")
    with pytest.raises(ConfigError, match="symbolic link"):
        _search(tiny)
    assert not (tiny / "nowhere").exists()
