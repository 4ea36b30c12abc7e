"""Storage failures and shared journals (issue 20): a full disk is said in one line and leaves a journal
that resumes; a journal another process may be writing is never cut under it."""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
from pathlib import Path

import optuna
import pytest

from echo_tune.cli.main import main
from echo_tune.search.storage import study_storage as storage_module
from echo_tune.search.storage.study_storage import DurableJournalFile, open_storage

REPO = Path(__file__).resolve().parents[2]
SMALL = str(REPO / "search_spaces" / "small-gpt7b-16xa100.yaml")


def _errors(err: str) -> list[str]:
    """stderr without the plain progress lines of a search."""
    return [line for line in err.splitlines() if not line.startswith("search ")]


def _finished(store, name="small-gpt7b-16xa100") -> int:
    study = optuna.load_study(study_name=name, storage=store.storage)
    return len([t for t in study.get_trials() if t.state.is_finished()])


def test_full_disk_under_a_journal_says_disk_full_and_resumes(tmp_path, monkeypatch, capsys):
    real_fsync = os.fsync
    calls = [0]

    def fsync(fd):  # the disk fills up after a few journal writes
        if os.readlink(f"/proc/self/fd/{fd}").endswith("journal.log"):
            calls[0] += 1
            if calls[0] > 6:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    argv = ["search", SMALL, "--n-trials", "20", "--results-dir", str(tmp_path)]
    assert main(argv) == 2
    err = _errors(capsys.readouterr().err)
    assert len(err) == 1 and "disk full" in err[0] and "Cannot tell" not in err[0], err
    monkeypatch.setattr(os, "fsync", real_fsync)
    store = open_storage(tmp_path / "small-gpt7b-16xa100")
    kept = _finished(store)
    assert 0 < kept < 20  # the journal holds whole records only and still loads
    assert main(argv + ["--resume", "--json"]) == 0
    assert _finished(open_storage(tmp_path / "small-gpt7b-16xa100")) == 20


def test_full_disk_under_sqlite_says_disk_full(tmp_path, monkeypatch, capsys):
    from optuna.exceptions import StorageInternalError
    from optuna.storages import RDBStorage

    real = RDBStorage.set_trial_state_values
    calls = [0]

    def full(self, *args, **kw):
        calls[0] += 1
        if calls[0] > 3:
            try:
                raise sqlite3.OperationalError("database or disk is full")
            except sqlite3.OperationalError as exc:
                raise StorageInternalError("An exception is raised during the commit.") from exc
        return real(self, *args, **kw)
    monkeypatch.setattr(RDBStorage, "set_trial_state_values", full)
    # the trial-by-trial path (tell -> set_trial_state_values); the default search stores batches of trials
    code = main(["search", SMALL, "--sampler", "tpe", "--n-trials", "10", "--results-dir", str(tmp_path),
                 "--storage", f"sqlite:///{tmp_path / 'study.db'}"])
    err = _errors(capsys.readouterr().err)
    assert code == 2 and len(err) == 1 and "disk full" in err[0], err


def _journal_with_a_trial(path: Path) -> None:
    from optuna.storages import JournalStorage

    study = optuna.create_study(study_name="s", storage=JournalStorage(DurableJournalFile(path)))
    study.add_trial(optuna.trial.create_trial(value=1.0))


def test_a_live_writers_half_line_is_not_cut(tmp_path, monkeypatch):
    """Another process (here: this test) is in the middle of a line: appending waits for it to finish
    instead of cutting it, and the file stays valid."""
    monkeypatch.setattr(storage_module, "TAIL_WAIT_S", 30.0, raising=False)
    monkeypatch.setattr(storage_module, "TAIL_QUIET_S", 5.0, raising=False)  # far above the 0.2 s between the writer's changes
    path = tmp_path / "journal.log"
    _journal_with_a_trial(path)
    record = b'{"op_code":2,"worker_id":"w","study_id":0,"user_attr":{"note":"from the other writer"}}\n'
    with open(path, "ab") as f:
        f.write(record[:30])
        f.flush()
    done = threading.Event()

    def append() -> None:
        storage = optuna.storages.JournalStorage(DurableJournalFile(path))
        study = optuna.load_study(study_name="s", storage=storage)
        study.add_trial(optuna.trial.create_trial(value=2.0))
        done.set()
    writer = threading.Thread(target=append)
    writer.start()
    for _ in range(4):  # the other writer is still at it: its half line changes now and then
        time.sleep(0.2)
        os.utime(path)
        assert not done.is_set()
    assert path.read_bytes().endswith(record[:30])  # not cut
    with open(path, "ab") as f:
        f.write(record[30:])
    writer.join(timeout=30)
    assert done.is_set()
    study = optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(DurableJournalFile(path)))
    assert [t.value for t in study.get_trials()] == [1.0, 2.0]
    assert study.user_attrs["note"] == "from the other writer"


def test_optunas_lock_file_keeps_the_half_line(tmp_path, monkeypatch):
    """While Optuna's own JournalFileBackend holds its lock file, a half line is its writer's: never cut;
    past the wait the append is refused in one line."""
    monkeypatch.setattr(storage_module, "TAIL_WAIT_S", 0.5, raising=False)
    monkeypatch.setattr(storage_module, "TAIL_QUIET_S", 0.0, raising=False)
    path = tmp_path / "journal.log"
    _journal_with_a_trial(path)
    os.symlink(path, str(path) + ".lock")  # JournalFileSymlinkLock's lock
    with open(path, "ab") as f:
        f.write(b'{"op_code":2,"wor')
    study = optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(DurableJournalFile(path)))
    assert [t.value for t in study.get_trials()] == [1.0]  # readers skip the half line
    with pytest.raises(Exception, match="half-written line"):
        study.add_trial(optuna.trial.create_trial(value=2.0))
    assert path.read_bytes().endswith(b'{"op_code":2,"wor')
    os.unlink(str(path) + ".lock")  # the writer is gone: now the dead half line is cut and the append goes in
    study = optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(DurableJournalFile(path)))
    study.add_trial(optuna.trial.create_trial(value=2.0))
    assert [t.value for t in optuna.load_study(study_name="s", storage=optuna.storages.JournalStorage(
        DurableJournalFile(path))).get_trials()] == [1.0, 2.0]
