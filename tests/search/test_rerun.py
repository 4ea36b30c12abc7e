"""The same `echo-tune search` command run twice (issue 40), and claims of workers on other hosts (issue 41)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
SMALL = REPO / "search_spaces" / "small-gpt7b-16xa100.yaml"


def _search(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "echo_tune.cli.main", "search", str(SMALL), *args], env=ENV,
                          capture_output=True, text=True, timeout=600)


def test_same_search_twice_shows_its_result_again(tmp_path):
    """Before, the second run failed: "study ... already exists". Now a finished search run again prints its
    result again (nothing simulated, a note says so); with other options it says in one line what to pass."""
    args = ["--sampler", "tpe", "--n-trials", "12", "--seed", "3", "--results-dir", str(tmp_path), "--json"]
    first = _search(*args)
    assert first.returncode == 0, first.stderr[-2000:]
    again = _search(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert b["new_trials"] == 0 and b["n_trials"] == a["n_trials"] == 12
    assert b["best"]["config"] == a["best"]["config"] and b["best"]["step_time_s"] == a["best"]["step_time_s"]
    assert any("shown again" in n for n in b["notes"])
    other = _search(*[a if a != "3" else "4" for a in args])  # another seed: not the search that finished it
    assert other.returncode == 2
    line = other.stderr.strip().splitlines()[-1]
    assert "already exists" in line and "--resume" in line and "--overwrite" in line and "--seed" in line


def test_claim_on_another_host_is_taken_over_only_when_its_heartbeat_stops(monkeypatch):
    from echo_tune.search import tickets

    clock = [100.0]
    monkeypatch.setattr(tickets.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(tickets, "LEASE_S", 60.0)
    watch = tickets._Watch()

    def ticket(beat, claimant="elsewhere:123"):
        return SimpleNamespace(_trial_id=7, user_attrs={tickets.CLAIMANT_ATTR: claimant, tickets.HEARTBEAT_ATTR: beat})
    assert not watch.stale(ticket(1))
    clock[0] += 50
    assert not watch.stale(ticket(1))
    clock[0] += 20
    assert not watch.stale(ticket(2))  # it beat: alive, timed again from now
    clock[0] += 59
    assert not watch.stale(ticket(2))
    clock[0] += 2
    assert watch.stale(ticket(2))  # 61 s without a beat
    # on this host the process table decides at once
    assert watch.stale(SimpleNamespace(_trial_id=8, user_attrs={tickets.CLAIMANT_ATTR: tickets.worker_id().rsplit(
        ":", 1)[0] + ":999999999", tickets.HEARTBEAT_ATTR: 0}))
    assert not watch.stale(SimpleNamespace(_trial_id=9, user_attrs={tickets.CLAIMANT_ATTR: tickets.worker_id(),
                                                                     tickets.HEARTBEAT_ATTR: 0}))


def test_summary_counts_each_layout_once_and_names_the_missing(small_space, small_exhaustive, tmp_path):
    """A study holding one layout twice and missing two: the coverage counts distinct layouts, notes name both,
    and a run that should have covered the space is reported as not finished (exit 130, --resume)."""
    import time

    import optuna

    from echo_tune.search import check_space
    from echo_tune.search.storage import open_storage
    from echo_tune.search.summary import summarize

    store = open_storage(Path(small_exhaustive.results_dir), small_exhaustive.storage)
    trials = optuna.load_study(study_name=small_exhaustive.study_name, storage=store.storage).get_trials()
    broken = optuna.create_study(study_name="broken", storage=optuna.storages.InMemoryStorage())
    kept = trials[2:] + [trials[5]]
    broken.add_trials(kept)
    valid, _ = check_space(small_space)
    result = summarize(small_space, broken, sampler="exhaustive", name="broken", out_dir=tmp_path, where="memory",
                       started=time.monotonic(), space_size=len(valid), notes=[], done_before=0, interrupted=False,
                       write_files=False, valid=valid, expect_all=True)
    assert result.n_trials == len(valid) - 1 and result.n_duplicates == 1
    assert result.coverage == (len(valid) - 2) / len(valid)
    assert len(result.missing) == 2 and result.interrupted
    assert any("stored more than once" in n for n in result.notes)
    assert any("2 valid layout(s) were never simulated" in n and "--resume" in n for n in result.notes)
