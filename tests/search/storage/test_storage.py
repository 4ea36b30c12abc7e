"""The default study storage: a journal file that survives SIGKILL and stays readable by Optuna."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from echo_tune.search.storage.study_storage import DurableJournalFile, open_storage


def make_study(path, n=3):
    storage = JournalStorage(DurableJournalFile(path))
    study = optuna.create_study(study_name="s", storage=storage, load_if_exists=True)
    for i in range(n):
        trial = study.ask()
        trial.suggest_int("x", 0, 10)
        study.tell(trial, float(i))
    return study


def values(path):
    study = optuna.load_study(study_name="s", storage=JournalStorage(DurableJournalFile(path)))
    return [t.value for t in study.get_trials()]


def test_torn_last_line_is_cut_on_open(tmp_path):
    path = tmp_path / "journal.log"
    make_study(path)
    with open(path, "ab") as f:  # a writer killed in the middle of a record
        f.write(b'{"op_code":4,"worker_id":"x","trial_id":3,"par')
    assert values(path) == [0.0, 1.0, 2.0]
    make_study(path, n=2)  # appending after the repair keeps the file valid
    assert values(path) == [0.0, 1.0, 2.0, 0.0, 1.0]


def test_optuna_own_backend_reads_it(tmp_path):
    """optuna-dashboard opens journal files with Optuna's JournalFileBackend."""
    path = tmp_path / "journal.log"
    make_study(path, n=4)
    study = optuna.load_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))))
    assert [t.value for t in study.get_trials()] == [0.0, 1.0, 2.0, 3.0]


def test_batch_writes_once_at_the_end(tmp_path):
    path = tmp_path / "journal.log"
    journal = DurableJournalFile(path)
    study = optuna.create_study(study_name="s", storage=JournalStorage(journal))
    size = path.stat().st_size
    with journal.batch():
        trial = study.ask()
        trial.suggest_float("x", 0, 1)
        study.tell(trial, 1.0)
        assert path.stat().st_size == size  # nothing on disk yet, but the study sees its own trial
        assert len(study.get_trials()) == 1
    assert path.stat().st_size > size
    assert values(path) == [1.0]


def test_two_writers_share_one_file(tmp_path):
    path = tmp_path / "journal.log"
    a = optuna.create_study(study_name="s", storage=JournalStorage(DurableJournalFile(path)))
    b = optuna.load_study(study_name="s", storage=JournalStorage(DurableJournalFile(path)))
    for i in range(5):
        for study in (a, b):
            trial = study.ask()
            study.tell(trial, float(i))
    assert len(values(path)) == 10


def test_lock_of_a_killed_process_is_released(tmp_path):
    path = tmp_path / "journal.log"
    code = ("import sys, time; from echo_tune.search.storage.study_storage import DurableJournalFile; "
            "j = DurableJournalFile(sys.argv[1]); b = j.batch(); b.__enter__(); print('locked', flush=True); "
            "time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "locked"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        start = time.monotonic()
        make_study(path, n=1)  # needs the lock
        assert time.monotonic() - start < 5
    finally:
        proc.kill()


def test_other_storage_urls(tmp_path):
    store = open_storage(tmp_path, f"sqlite:///{tmp_path / 'x.db'}")
    assert store.journal is None and store.where.startswith("sqlite")
    store = open_storage(tmp_path, str(tmp_path / "other.log"))
    assert store.journal is not None
