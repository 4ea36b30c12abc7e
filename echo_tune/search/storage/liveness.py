"""Sampling workers on other hosts: a heartbeat per worker, and their trials taken over when it stops.

On this host a RUNNING trial's worker (``claim.WORKER_ATTR``, ``host:pid``) is alive while its process is.
Another host's process cannot be seen from here, so each sampling worker raises a counter in the study's
system attributes (``HEARTBEAT_PREFIX + host:pid``) every ``HEARTBEAT_S`` seconds while it runs
(``heartbeat``). A worker of another host whose counter has not moved for ``LEASE_S`` seconds, timed here (the
hosts' clocks need not agree), is gone: ``reap`` tells its RUNNING trials FAIL, so their layouts are asked
again (``sampler.ValidLayoutSampler._update_seen``), as a killed local worker's are on resume
(``accounting.fail_dead_running``). A sampling run that has reached its target waits for the other workers'
trials in flight before it ends, so a resumed study is not left with a dead worker's trial RUNNING.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from optuna.trial import TrialState
from optuna.storages import JournalStorage

from echo_tune.search.storage.claim import WORKER_ATTR, beating, claim, same_host, worker_alive, worker_id
from echo_tune.search.storage.study_storage import DurableJournalFile

HEARTBEAT_PREFIX = "echo-tune-heartbeat:"
LEASE_S = 60.0


def _own_storage(store):
    """A storage for the heartbeat thread. Our journal: a second instance over the same file (its own locks; the
    processes' ``flock`` still orders the writes). Sharing the search's, the thread took the storage's lock and
    then the file's while the search's thread, inside a batch, held the file's and wanted the storage's."""
    if store.journal is None:
        return store.storage

    return JournalStorage(DurableJournalFile(store.journal.path))


@contextlib.contextmanager
def heartbeat(study, store) -> Iterator[None]:
    """Raise this worker's counter in ``study`` every ``HEARTBEAT_S`` while the block runs (a thread)."""
    key = HEARTBEAT_PREFIX + worker_id()
    try:
        storage = _own_storage(store)
        study_id = storage.get_study_id_from_name(study.study_name)
    except Exception:  # noqa: BLE001 - the storage is gone: the search's own writes say so
        yield
        return
    with beating(lambda n: storage.set_study_system_attr(study_id, key, n), at_once=True):
        yield


class Reaper:
    """Watches the other hosts' workers with RUNNING trials in one study (see the module docstring)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[object, float]] = {}

    def _gone(self, worker: str | None, beats: dict) -> bool:
        if worker is not None and same_host(worker):
            return not worker_alive(worker)
        beat = beats.get(HEARTBEAT_PREFIX + worker) if worker else None
        now = time.monotonic()
        last = self._seen.get(worker or "")
        if last is None or last[0] != beat:
            self._seen[worker or ""] = (beat, now)
            return False
        return now - last[1] > LEASE_S

    def others_running(self, study) -> list:
        """RUNNING trials of other workers (not this process's)."""
        me = worker_id()
        return [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if t.user_attrs.get(WORKER_ATTR) != me]

    def reap(self, study, store) -> int:
        """FAIL the RUNNING trials of workers gone (a dead local process, or a silent remote one); returns how
        many, and how many trials of live workers are in flight is ``others_running`` less those."""
        running = [t for t in self.others_running(study) if t.user_attrs.get(WORKER_ATTR) is not None]
        if not running:
            return 0
        beats = study._storage.get_study_system_attrs(study._study_id)
        gone = [t for t in running if self._gone(t.user_attrs.get(WORKER_ATTR), beats)]
        failed = 0
        if gone:
            with claim(store):
                for t in gone:
                    try:
                        failed += bool(study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL))
                    except Exception:  # noqa: BLE001 - finished by its worker meanwhile
                        continue
        return failed
