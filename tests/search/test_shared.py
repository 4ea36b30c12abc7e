"""Several `echo-tune search --resume` workers on one PostgreSQL study (a real server, started here).

PostgreSQL's ``initdb`` and ``pg_ctl`` come from the distribution's packages (``.ci/run`` installs them);
the tests skip, saying why, only where no server can be started. The server refuses to run as root, so
as root it runs as the ``postgres`` user the package creates.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from echo_tune.search import SearchOptions, check_space, load_space, run_search
from echo_tune.search.shared import CLAIMS_SUFFIX, shares_work, ticket_size

REPO = Path(__file__).resolve().parents[2]
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


def _binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url():
    pytest.importorskip("psycopg", reason="the PostgreSQL driver (psycopg) is not installed: pip install -e '.[test]'")
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("no PostgreSQL server here (initdb/pg_ctl not found; Debian: apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="echo-tune-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no `postgres` user to run the server as")
        os.chown(root, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()
    steps = [[initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
             [pg_ctl, "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60",
              "-o", f"-p {port} -k {root} -h 127.0.0.1 -F", "start"]]
    for step in steps:
        done = subprocess.run(as_user + step, capture_output=True, text=True)
        if done.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip(f"cannot start a PostgreSQL server: {Path(step[0]).name} said "
                        f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(as_user + [pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


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
    configs = [tuple(sorted(t.params.items())) for t in trials]
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
