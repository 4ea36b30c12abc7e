"""The same `echo-tune search` command run twice (issue 40), and claims of workers on other hosts (issue 41)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[3]
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
    from echo_tune.search.engines import tickets

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
    from echo_tune.search.storage.study_storage import open_storage
    from echo_tune.search.outputs.summary import summarize

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


def test_trial_of_a_silent_worker_on_another_host_is_taken_over(monkeypatch, tmp_path):
    """A sampling worker on another host killed mid-trial left it RUNNING, assumed alive forever: its layout was
    never simulated. Now a run waits for other workers' trials in flight and fails those whose worker's
    heartbeat stops (``liveness.py``), then asks their layouts again: every layout once, nothing left RUNNING."""
    import optuna
    from optuna.trial import TrialState

    from echo_tune.search import SearchOptions, check_space, load_space, run_search
    from echo_tune.search.storage import liveness
    from echo_tune.search.storage.accounting import account
    from echo_tune.search.storage.claim import WORKER_ATTR
    from echo_tune.search.space.params import full_params, search_distributions
    from echo_tune.search.storage.study_storage import open_storage

    space_file = tmp_path / "micro.yaml"
    space_file.write_text((Path(__file__).parent.parent / "test_killed_resume.py").read_text().split('SPACE = """\\\n')[1]
                          .split('"""')[0].format(name="remote"))
    space = load_space(space_file)
    valid, _ = check_space(space)
    opts = dict(sampler="random", seed=0, results_dir=tmp_path, study_name="remote", write_files=False)
    run_search(space, SearchOptions(n_trials=10, **opts))
    storage = open_storage(tmp_path / "remote", None).storage
    study = optuna.load_study(study_name="remote", storage=storage)
    done = {tuple(sorted(t.params.items())) for t in study.get_trials()}
    unseen = next(c for c in valid if tuple(sorted(full_params(space, c).items())) not in done)
    study.enqueue_trial(full_params(space, unseen))
    trial = study.ask(search_distributions(space))  # a worker on another host took it, then died
    trial.set_user_attr(WORKER_ATTR, "another-host:4242")
    monkeypatch.setattr(liveness, "LEASE_S", 0.5)
    result = run_search(space, SearchOptions(n_trials=len(valid), resume=True, **opts))
    study = optuna.load_study(study_name="remote", storage=storage)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    acc = account(study.get_trials(), valid, space)
    assert acc.distinct == len(valid) and not acc.duplicates and not acc.missing
    assert result.coverage == 1.0 and not result.interrupted
    assert [t.state for t in study.get_trials() if t.user_attrs.get(WORKER_ATTR) == "another-host:4242"] == \
        [TrialState.FAIL]


def test_remote_worker_with_a_moving_heartbeat_is_waited_for(monkeypatch):
    from echo_tune.search.storage import liveness

    clock = [0.0]
    monkeypatch.setattr(liveness.time, "monotonic", lambda: clock[0])
    reaper = liveness.Reaper()
    key = liveness.HEARTBEAT_PREFIX + "far:1"
    for beat in range(5):  # it beats every 50 s: never 60 s silent
        assert not reaper._gone("far:1", {key: beat})
        clock[0] += 50
    assert not reaper._gone("far:1", {key: 4})
    clock[0] += 61
    assert reaper._gone("far:1", {key: 4})
