"""SIGTERM (a scheduler's time limit) is handled like Ctrl-C: trials kept, outputs written, exit 130."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
SMALL = str(REPO / "search_spaces" / "small-gpt7b-16xa100.yaml")


def test_sigterm_writes_outputs_and_exits_130(tmp_path):
    cmd = [sys.executable, "-m", "echo_tune.cli.main", "search", SMALL, "--sampler", "random", "--n-trials",
           "100000", "--study-name", "term", "--results-dir", str(tmp_path), "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    journal = tmp_path / "term" / "journal.log"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (journal.exists() and journal.stat().st_size > 20000):
            time.sleep(0.3)
            assert proc.poll() is None, proc.stderr.read().decode()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err.decode()
    assert "interrupted" in err.decode()
    summary = json.loads(out)
    assert summary["interrupted"] and summary["n_trials"] > 0
    assert (tmp_path / "term" / "trials.csv").is_file() and (tmp_path / "term" / "best.json").is_file()


def test_plain_progress_lines_when_not_on_a_terminal(tmp_path):
    """Batch-job logs get plain lines with counts and best-so-far, in sampling and exhaustive mode."""
    for sampler, extra in (("tpe", ["--n-trials", "20"]), ("exhaustive", [])):
        proc = subprocess.run([sys.executable, "-m", "echo_tune.cli.main", "search", SMALL, "--sampler", sampler,
                               *extra, "--results-dir", str(tmp_path / sampler), "--json"],
                              capture_output=True, text=True, env=ENV, timeout=300)
        assert proc.returncode == 0, proc.stderr
        lines = [l for l in proc.stderr.splitlines() if l.startswith("search small-gpt7b-16xa100:")]
        assert "sampler" in lines[0]
        counted = [l for l in lines if " trials, best step " in l]
        assert len(counted) >= 5 and counted[-1].split(": ")[1].split(" ")[0].split("/")[0] == \
            counted[-1].split("/")[1].split(" ")[0]  # the last line is done/total with done == total
        assert "none fits yet" not in counted[-1]


def _journal_trials(path: Path) -> int:
    import optuna

    from echo_tune.search.storage.study_storage import open_storage

    store = open_storage(path.parent, str(path))
    study = optuna.load_study(study_name="group", storage=store.storage)
    return len([t for t in study.get_trials(deepcopy=False) if t.state.name in ("COMPLETE", "PRUNED")])


def _sigterm_group_midway(cmd: list[str], journal: Path) -> tuple[int, bytes, str]:
    """Start ``cmd`` in its own process group, SIGTERM the whole group once its journal holds some trials;
    (exit code, stdout, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (journal.exists() and journal.stat().st_size > 50000):
            time.sleep(0.05)
            assert proc.poll() is None, proc.stderr.read().decode()
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err.decode()


def test_sigterm_to_the_process_group_of_a_parallel_exhaustive_search(tmp_path):
    """A scheduler signals the whole process group: the loky workers must not die mid-batch (issue 20: a
    TerminatedWorkerError traceback and no outputs); the parent stops after the batch in hand, writes
    trials.csv and best.json from every stored trial, says so in one line, and the study resumes."""
    cmd = [sys.executable, "-m", "echo_tune.cli.main", "search", SMALL, "--sampler", "exhaustive", "--n-jobs", "2",
           "--study-name", "group", "--results-dir", str(tmp_path), "--json"]
    journal = tmp_path / "group" / "journal.log"
    returncode, out, err = _sigterm_group_midway(cmd, journal)
    assert returncode == 130, err
    assert "Traceback" not in err and "TerminatedWorkerError" not in err, err
    assert "interrupted" in err.splitlines()[-1] and "--resume" in err.splitlines()[-1], err
    summary = json.loads(out)
    stored = _journal_trials(journal)
    assert summary["interrupted"] and 0 < summary["n_trials"] == stored < 744
    rows = (tmp_path / "group" / "trials.csv").read_text().strip().splitlines()
    assert len(rows) - 1 == stored  # every stored trial is in trials.csv
    assert json.loads((tmp_path / "group" / "best.json").read_text())["trial"] >= 0
    again = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, env=ENV, timeout=300)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["n_trials"] == 744 and _journal_trials(journal) == 744


def test_sigterm_to_the_process_group_of_a_parallel_sampling_search(tmp_path):
    """The sampling workers (--n-jobs 2, random) finish the trial in hand and return: no BrokenProcessPool,
    the outputs are written, exit 130 with one line."""
    cmd = [sys.executable, "-m", "echo_tune.cli.main", "search", SMALL, "--sampler", "random", "--n-jobs", "2",
           "--n-trials", "700", "--study-name", "group", "--results-dir", str(tmp_path), "--json"]
    journal = tmp_path / "group" / "journal.log"
    returncode, out, err = _sigterm_group_midway(cmd, journal)
    assert returncode == 130 and "Traceback" not in err and "interrupted" in err.splitlines()[-1], err
    summary = json.loads(out)
    assert summary["interrupted"] and 0 < summary["n_trials"] == _journal_trials(journal) < 700
    assert (tmp_path / "group" / "best.json").is_file()
    assert len((tmp_path / "group" / "trials.csv").read_text().strip().splitlines()) - 1 >= summary["n_trials"]


def test_the_processes_a_command_starts_keep_lokys_tracker_warnings_off_its_last_line(monkeypatch):
    from echo_tune.cli.main import main

    monkeypatch.setenv("PYTHONWARNINGS", "default")
    assert main(["presets"]) == 0
    child = subprocess.run([sys.executable, "-c", "import warnings; warnings.warn('resource_tracker: /loky-1: "
                            "FileNotFoundError', UserWarning); warnings.warn('kept', UserWarning)"],
                           capture_output=True, text=True, env=dict(os.environ))
    assert "resource_tracker" not in child.stderr and "UserWarning: kept" in child.stderr
    assert os.environ["PYTHONWARNINGS"].split(",")[0] == "default"  # the user's filters stay, first
