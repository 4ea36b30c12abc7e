"""Many `echo-tune search --resume` workers started together on one study (issue 10, concurrency).

Three processes on a fresh journal, SQLite database and PostgreSQL server, with the sampling mode
(random everywhere, TPE on the journal: both take the same claim path): together they hold exactly the target number of trials, no layout
twice, every trial finished, the baselines once. And a worker of ``--n-jobs 2`` dies with its parent.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from echo_tune.search import check_space, load_space
from echo_tune.search.storage.claim import WORKER_ATTR
from echo_tune.search.space.baselines import baselines
from echo_tune.search.storage.study_storage import open_storage

REPO = Path(__file__).resolve().parents[2]
SMALL = REPO / "search_spaces" / "small-gpt7b-16xa100.yaml"
WORKERS, TARGET = 3, 40
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def _search(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "echo_tune.cli.main", "search", str(SMALL), *args], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _workers_together(storage_args: list[str], results: Path, name: str, sampler: str = "random") -> None:
    workers = [_search("--sampler", sampler, "--n-trials", str(TARGET), "--resume", "--study-name", name,
                       "--results-dir", str(results), "--seed", str(i), *storage_args) for i in range(WORKERS)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    for w, out in zip(workers, outputs):
        assert w.returncode == 0, out[-2000:]


def _check_study(storage, name: str) -> None:
    study = optuna.load_study(study_name=name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == TARGET  # none lost, no overshoot
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in trials)
    assert len({tuple(sorted(t.params.items())) for t in trials}) == TARGET  # no layout twice
    space = load_space(SMALL)
    valid, _ = check_space(space)
    expected = len(baselines(space, valid)[:TARGET])
    assert sum(bool(t.user_attrs.get("baseline")) for t in trials) == expected  # enqueued once
    assert all(t.user_attrs.get(WORKER_ATTR) for t in trials)  # every trial names the worker that ran it
    # (how many of the three workers got trials depends on the machine's load: one may finish the target
    # before another has started; what must hold is the count, checked above)


def _storage_url(kind: str, tmp_path: Path, request) -> tuple[list[str], object]:
    if kind == "journal":
        path = tmp_path / "journal.log"
        return ["--storage", str(path)], open_storage(tmp_path, str(path)).storage
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'study.db'}"
        return ["--storage", url], url
    url = request.getfixturevalue("postgres_url")
    return ["--storage", url], url


@pytest.mark.parametrize("kind,sampler", [("journal", "random"), ("sqlite", "random"), ("postgresql", "random"),
                                          ("journal", "tpe")])
def test_three_workers_fresh_then_existing_study(kind, sampler, tmp_path, request):
    storage_args, storage = _storage_url(kind, tmp_path, request)
    name = f"conc-{kind}-{sampler}"
    _workers_together(storage_args, tmp_path / "r", name, sampler)  # fresh storage, fresh study
    _check_study(storage, name)
    global TARGET
    old, TARGET = TARGET, TARGET + 15  # existing study: resume to a larger target, again together
    try:
        _workers_together(storage_args, tmp_path / "r", name, sampler)
        _check_study(storage, name)
    finally:
        TARGET = old


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_worker_dies_with_sigkilled_parent(tmp_path):
    journal = tmp_path / "journal.log"
    parent = _search("--sampler", "random", "--n-trials", "100000", "--n-jobs", "2", "--storage", str(journal),
                     "--results-dir", str(tmp_path))
    try:
        deadline = time.monotonic() + 120
        workers: set[str] = set()
        while len(workers) < 2 and time.monotonic() < deadline:  # both processes are searching
            time.sleep(0.5)
            if journal.exists():
                text = journal.read_text()
                workers = {w for w in (line.split(f'"{WORKER_ATTR}":"', 1)[1].split('"', 1)[0]
                                       for line in text.splitlines() if f'"{WORKER_ATTR}":"' in line)}
        assert len(workers) == 2, "the --n-jobs 2 worker never started a trial"
        pids = [int(w.rsplit(":", 1)[1]) for w in workers]
        child = next(p for p in pids if p != parent.pid)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        _wait_until_gone([child])
        assert not _alive(child), "the worker outlived its SIGKILLed parent"
    finally:
        _kill_with_children(parent.pid)


def _kill_with_children(pid: int) -> None:
    for p in [pid, *_children(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _wait_until_gone(pids: list[int], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_exhaustive_pool_dies_with_sigkilled_parent(tmp_path):
    space = tmp_path / "space.yaml"  # big enough that the pool is still busy when the parent is killed
    text = SMALL.read_text().replace("global_batch_size: 256", "global_batch_size: 1536")
    space.write_text(text.replace("micro_batch_size: [1, 2, 4, 8]", "micro_batch_size: auto"))
    parent = subprocess.Popen([sys.executable, "-m", "echo_tune.cli.main", "search", str(space), "--sampler",
                               "exhaustive", "--n-jobs", "3", "--results-dir", str(tmp_path)], env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        workers: list[int] = []
        while len(workers) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
            workers = [p for p in _children(parent.pid) if "loky" in _cmdline(p) and "resource_tracker" not in
                       _cmdline(p) and "semaphore" not in _cmdline(p)]
        if parent.poll() is not None:
            pytest.skip("the search finished before its pool could be observed")
        assert len(workers) >= 2, "the exhaustive pool never started"
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=10)
        _wait_until_gone(workers)
        assert not any(_alive(w) for w in workers), "a pool worker outlived its SIGKILLed parent"
    finally:
        _kill_with_children(parent.pid)
