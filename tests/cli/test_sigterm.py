"""SIGTERM (a scheduler's time limit) is handled like Ctrl-C: trials kept, outputs written, exit 130."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SMALL = str(REPO / "search_spaces" / "small-gpt7b-16xa100.yaml")


def test_sigterm_writes_outputs_and_exits_130(tmp_path):
    cmd = [sys.executable, "-m", "echo_tune.cli.main", "search", SMALL, "--sampler", "random", "--n-trials",
           "100000", "--study-name", "term", "--results-dir", str(tmp_path), "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
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
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for sampler, extra in (("tpe", ["--n-trials", "20"]), ("exhaustive", [])):
        proc = subprocess.run([sys.executable, "-m", "echo_tune.cli.main", "search", SMALL, "--sampler", sampler,
                               *extra, "--results-dir", str(tmp_path / sampler), "--json"],
                              capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        lines = [l for l in proc.stderr.splitlines() if l.startswith("search small-gpt7b-16xa100:")]
        assert "sampler" in lines[0]
        counted = [l for l in lines if " trials, best step " in l]
        assert len(counted) >= 5 and counted[-1].split(": ")[1].split(" ")[0].split("/")[0] == \
            counted[-1].split("/")[1].split(" ")[0]  # the last line is done/total with done == total
        assert "none fits yet" not in counted[-1]
