"""A SIGKILLed, resumed or concurrent search accounts for every layout exactly once (issue 41 item 2).

Each test runs real `echo-tune search` processes, kills one with SIGKILL at a chosen moment, resumes, and reads
the storage back with Optuna's own API: every valid layout of the space is held by exactly one finished trial.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from echo_tune.search import check_space, load_space
from echo_tune.search.space.layouts import config_key
from echo_tune.search.space.params import search_distributions
from echo_tune.search.storage.study_storage import open_storage

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
SPACE = """\
name: {name}
model: gpt-7.5b
cluster: a100-40gb
num_gpus: 16
global_batch_size: 256
precision: bf16
objectives: [step_time]
layout:
  tensor_model_parallel_size: [2, 4]
  pipeline_model_parallel_size: [1, 2]
  micro_batch_size: [1, 4]
  virtual_pipeline_model_parallel_size: [1]
  sequence_parallel: auto
  recompute_granularity: [none, full]
  use_distributed_optimizer: true
  overlap_grad_reduce: true
"""


def space_file(tmp_path: Path, name: str, text: str = SPACE) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text.format(name=name))
    return path


def search(space: Path, *args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "echo_tune.cli.main", "search", str(space), *args],
                            env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


SLOW_EVALUATE = """\
import time
import echo_tune.search.engines.objective as _objective
def _slowed(f):
    def slow(*args, **kw):
        time.sleep(0.3)
        return f(*args, **kw)
    return slow
_objective.evaluate = _slowed(_objective.evaluate)
_objective.evaluate_memory = _slowed(_objective.evaluate_memory)  # a batch computes a layout's memory first
"""


SLOW_TICKET = """\
import echo_tune.search.engines.tickets as _tickets
_run = _tickets.run_exhaustive
def _held(*args, **kw):  # a claimed batch stays RUNNING a while after its layouts are stored: a window to kill in
    stored = _run(*args, **kw)
    time.sleep(1.0)
    return stored
_tickets.run_exhaustive = _held
"""


def slow_env(tmp_path: Path, extra: str = "") -> dict:
    """ENV with every layout's simulation (and memory) 0.3 s longer, in the search and its spawned workers (a
    sitecustomize on PYTHONPATH): a layout is simulated in ~1 ms, too short a window to kill a search while a trial
    (or a claimed batch) is running."""
    folder = tmp_path / "slow"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(SLOW_EVALUATE + extra)
    return dict(ENV, PYTHONPATH=os.pathsep.join([str(folder), ENV["PYTHONPATH"]]))


def trial_key(trial) -> tuple:
    """The layout a finished trial holds: its record's config, or the config a pruned trial stores."""
    record = trial.user_attrs.get("record")
    return config_key(record["config"] if record else trial.user_attrs["config"])


def finished_once(space: Path, storage, name: str) -> tuple[Counter, set]:
    """Per layout key, how many finished trials hold it; and the space's valid keys."""
    study = optuna.load_study(study_name=name, storage=storage)
    held = Counter(trial_key(t) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,
                                                                                   TrialState.PRUNED)))
    valid, _ = check_space(load_space(space))
    return held, {c.key for c in valid}


def assert_every_layout_once(space: Path, storage, name: str) -> None:
    held, valid = finished_once(space, storage, name)
    twice = {k: n for k, n in held.items() if n > 1}
    assert not twice, f"{len(twice)} layout(s) stored more than once"
    assert set(held) == valid, f"{len(valid - set(held))} layout(s) never stored, {len(set(held) - valid)} foreign"
    study = optuna.load_study(study_name=name, storage=storage)
    assert not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)), "a killed run's trial left RUNNING"


def _simulating(db: Path, n_params: int) -> bool:
    """A trial is being simulated: RUNNING with every parameter suggested, after a few finished ones."""
    try:
        with sqlite3.connect(db, timeout=0.05) as conn:
            done = conn.execute("SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'").fetchone()[0]
            row = conn.execute("SELECT 1 FROM trials t WHERE t.state = 'RUNNING' AND (SELECT COUNT(*) FROM "
                               "trial_params p WHERE p.trial_id = t.trial_id) >= ? LIMIT 1", (n_params,)).fetchone()
    except sqlite3.Error:
        return False
    return done >= 3 and row is not None


class _JournalWatch:
    def __init__(self, path: Path):
        self.path, self.storage = path, None

    def __call__(self, n_params: int) -> bool:
        if not self.path.exists():
            return False
        if self.storage is None:
            self.storage = open_storage(self.path.parent, str(self.path)).storage
        try:
            study = optuna.load_study(study_name="killed-tpe", storage=self.storage)
        except KeyError:
            return False
        trials = study.get_trials(deepcopy=False)
        return sum(t.state == TrialState.COMPLETE for t in trials) >= 3 and any(
            t.state == TrialState.RUNNING and len(t.params) >= n_params for t in trials)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_sigkilled_two_process_tpe_resumes_every_layout_once(kind, tmp_path):
    """Finding 1: SIGKILL a --n-jobs 2 TPE search on SQLite (and a journal) while a trial is being simulated, then
    --resume. Before, the killed trial's layout counted as seen: it was never simulated, and once every other
    layout was done the sampler repeated layouts (coverage 1.0 with layouts missing and others stored twice)."""
    space = space_file(tmp_path, "killed-tpe")
    n_valid = len(check_space(load_space(space))[0])
    n_params = len(search_distributions(load_space(space)))
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}" if kind == "sqlite" else str(tmp_path / "study.log")
    simulating = (lambda n: _simulating(db, n)) if kind == "sqlite" else _JournalWatch(tmp_path / "study.log")
    args = ["--sampler", "tpe", "--n-trials", str(n_valid), "--n-jobs", "2", "--storage", url,
            "--results-dir", str(tmp_path / "r"), "--json"]
    proc = search(space, *args, env=slow_env(tmp_path))
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not simulating(n_params):
            time.sleep(0.005)
        assert proc.poll() is None, "the search ended before a trial could be caught running"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    time.sleep(1.0)  # its worker notices the parent is gone (die_with_parent polls every 0.5 s)
    if kind == "journal":
        url = open_storage(tmp_path, url).storage
    study = optuna.load_study(study_name="killed-tpe", storage=url)
    assert study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)), "nothing was left running"
    resumed = search(space, *args, "--resume")
    url = url if kind == "sqlite" else open_storage(tmp_path, str(tmp_path / "study.log")).storage
    out, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err[-2000:]
    summary = json.loads(out)
    assert_every_layout_once(space, url, "killed-tpe")
    assert summary["coverage"] == 1.0 and summary["n_duplicates"] == 0 and summary["missing"] == []
    assert summary["n_trials"] == n_valid


SMALL = REPO / "search_spaces" / "small-gpt7b-16xa100.yaml"


def test_two_concurrent_exhaustive_resumes_on_one_journal(tmp_path):
    """Finding 2: two exhaustive `--resume` runs started together on one journal study both simulated and
    stored the layouts missing when they started. Now the second waits for the first's run lease (saying so),
    then finds nothing left: both exit 0 and every layout is stored once."""
    journal = tmp_path / "shared.log"
    args = ["--sampler", "exhaustive", "--resume", "--storage", str(journal), "--study-name", "together",
            "--results-dir", str(tmp_path / "r"), "--json"]
    runs = [search(SMALL, *args), search(SMALL, *args)]
    outs = [r.communicate(timeout=600) for r in runs]
    for r, (out, err) in zip(runs, outs):
        assert r.returncode == 0, err[-2000:]
    storage = open_storage(tmp_path, str(journal)).storage
    assert_every_layout_once(SMALL, storage, "together")
    summaries = [json.loads(out) for out, _ in outs]
    assert all(s["coverage"] == 1.0 and s["n_duplicates"] == 0 for s in summaries)
    assert sorted(s["new_trials"] for s in summaries)[0] == 0  # the one that waited found nothing left


TINY = SPACE.replace("tensor_model_parallel_size: [2, 4]", "tensor_model_parallel_size: auto").replace(
    "pipeline_model_parallel_size: [1, 2]", "pipeline_model_parallel_size: auto").replace(
    "virtual_pipeline_model_parallel_size: [1]", "virtual_pipeline_model_parallel_size: [1, 3]").replace(
    "use_distributed_optimizer: true", "use_distributed_optimizer: auto")


@pytest.mark.parametrize("kind", ["postgresql", "sqlite"])
def test_killed_database_worker_claim_is_reissued(kind, tmp_path, request):
    """Finding 3: a PostgreSQL worker SIGKILLed mid-batch left its claimed ticket RUNNING; the gathering run
    never simulated those layouts and exited 0 (coverage 0.996, no note). Now the claim names its worker, and
    the gathering run re-issues a dead worker's claim and simulates it: every layout once, exit 0."""
    from echo_tune.search.engines.shared import CLAIMS_SUFFIX

    postgres_url = request.getfixturevalue("postgres_url") if kind == "postgresql" else f"sqlite:///{tmp_path}/s.db"
    name = f"killed-{kind}"
    space = space_file(tmp_path, name, TINY)
    args = ["--sampler", "exhaustive", "--resume", "--storage", postgres_url, "--json"]
    # each layout and each claimed batch's completion slowed: a window to kill the worker in with its claim RUNNING
    worker = search(space, *args, "--results-dir", str(tmp_path / "w"), env=slow_env(tmp_path, SLOW_TICKET))
    try:
        deadline = time.monotonic() + 300
        caught = False
        while time.monotonic() < deadline and worker.poll() is None and not caught:
            try:
                tickets = optuna.load_study(study_name=name + CLAIMS_SUFFIX, storage=postgres_url)
                trials = tickets.get_trials(deepcopy=False)
                caught = any(t.state == TrialState.COMPLETE for t in trials) and \
                    any(t.state == TrialState.RUNNING for t in trials)
            except KeyError:  # not created yet
                pass
            if not caught:
                time.sleep(0.02)
        assert caught, "no claimed batch was caught running"
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        worker.kill()
    tickets = optuna.load_study(study_name=name + CLAIMS_SUFFIX, storage=postgres_url)
    assert tickets.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    gather = search(space, *args, "--results-dir", str(tmp_path / "g"))
    out, err = gather.communicate(timeout=600)
    assert gather.returncode == 0, err[-2000:]
    assert_every_layout_once(space, postgres_url, name)
    summary = json.loads(out)
    assert summary["coverage"] == 1.0 and summary["missing"] == [] and summary["n_duplicates"] == 0
    left = optuna.load_study(study_name=name + CLAIMS_SUFFIX, storage=postgres_url).get_trials(deepcopy=False)
    assert {t.state for t in left} <= {TrialState.COMPLETE, TrialState.FAIL}  # the dead claim: FAIL, re-issued
    from echo_tune.search.engines.tickets import REISSUED_ATTR

    failed = [t.number for t in left if t.state == TrialState.FAIL]
    assert failed and sorted(t.user_attrs.get(REISSUED_ATTR) for t in left if t.user_attrs.get(REISSUED_ATTR) is not None
                             and t.user_attrs[REISSUED_ATTR] >= 0) == sorted(failed)
    # the same trials as one process storing every layout (a re-issued batch is simulated whole, so a layout's
    # recompute variants are judged against it as in one run, and only what was missing is stored)
    from echo_tune.search import SearchOptions, run_search

    run_search(load_space(space), SearchOptions(sampler="exhaustive", results_dir=tmp_path / "alone"))
    alone = open_storage(tmp_path / "alone" / name, None).storage

    def outcome(storage) -> dict:
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        return {trial_key(t): (t.state, t.user_attrs.get("dominated_by"), t.values) for t in trials}
    assert outcome(postgres_url) == outcome(alone)
