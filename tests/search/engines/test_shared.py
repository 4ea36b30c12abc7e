"""Several `echo-tune search --resume` workers on one PostgreSQL study (a real server, started here by the
``postgres_url`` fixture in conftest.py, which the concurrency tests share)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pandas as pd
from optuna.trial import TrialState

from echo_tune.search import SearchOptions, check_space, load_space, run_search
from echo_tune.search.engines.shared import CLAIMS_SUFFIX, shares_work, ticket_size
from echo_tune.search.storage.accounting import layout_key, trial_config

REPO = Path(__file__).resolve().parents[3]
SPACE = """\
name: shared-small
model: gpt-7.5b
cluster: a100-40gb
num_gpus: 16
global_batch_size: 256
precision: bf16
objectives: [step_time]
layout:
  tensor_model_parallel_size: auto
  pipeline_model_parallel_size: auto
  micro_batch_size: [1, 4]
  virtual_pipeline_model_parallel_size: [1, 3]
  sequence_parallel: auto
  recompute_granularity: [full]
  use_distributed_optimizer: auto
  overlap_grad_reduce: true
"""
WORKERS = 3


def test_storage_kinds():
    assert shares_work("postgresql://u@h/db") and shares_work("sqlite:///x.db")
    assert not shares_work(None) and not shares_work("results/x/journal.log") and not shares_work("redis://h")
    assert ticket_size(60) == 4 and ticket_size(1980) == 30 and ticket_size(10**6) == 32


def _rows(csv: Path) -> pd.DataFrame:
    """trials.csv without the trial number (workers interleave), one row per layout in a fixed order."""
    frame = pd.read_csv(csv).drop(columns=["trial"])
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def test_workers_share_one_postgres_study(postgres_url, tmp_path):
    space_file = tmp_path / "space.yaml"
    space_file.write_text(SPACE)
    valid, _ = check_space(load_space(space_file))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    workers = [subprocess.Popen([sys.executable, "-m", "echo_tune.cli.main", "search", str(space_file),
                                 "--sampler", "exhaustive", "--storage", postgres_url, "--resume",
                                 "--results-dir", str(tmp_path / f"worker{i}")],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i in range(WORKERS)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    for w, out in zip(workers, outputs):
        assert w.returncode == 0, out[-2000:]

    study = optuna.load_study(study_name="shared-small", storage=postgres_url)
    trials = study.get_trials(deepcopy=False)
    # a layout's identity: its config (a layout stored over memory without timing keeps no params, as a dominated one)
    configs = [layout_key(trial_config(t)) for t in trials]
    assert len(trials) == len(valid)  # none lost
    assert len(set(configs)) == len(valid)  # none stored twice
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    tickets = optuna.load_study(study_name="shared-small" + CLAIMS_SUFFIX, storage=postgres_url)
    assert {t.state for t in tickets.get_trials(deepcopy=False)} == {TrialState.COMPLETE}
    assert sum(len(t.user_attrs["layouts"]) for t in tickets.get_trials(deepcopy=False)) == len(valid)

    # one command gathers the outputs; they equal a one-process run of the same space
    gathered = run_search(load_space(space_file), SearchOptions(sampler="exhaustive", storage=postgres_url,
                                                               resume=True, results_dir=tmp_path / "gathered"))
    alone = run_search(load_space(space_file), SearchOptions(sampler="exhaustive", results_dir=tmp_path / "alone"))
    pd.testing.assert_frame_equal(_rows(tmp_path / "gathered/shared-small/trials.csv"),
                                  _rows(tmp_path / "alone/shared-small/trials.csv"))
    best = [json.loads((tmp_path / f"{run}/shared-small/best.json").read_text()) for run in ("gathered", "alone")]
    assert {k: v for k, v in best[0].items() if k != "trial"} == {k: v for k, v in best[1].items() if k != "trial"}
    assert gathered.best["config"] == alone.best["config"] and gathered.best["step_time_s"] == alone.best["step_time_s"]
