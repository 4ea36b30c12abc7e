"""Finished trials appended to our journal as one batch of records, not one Optuna call per trial.

``Study.add_trials`` stores a trial at a time: it serialises every distribution of every trial to JSON
again (the same nine strings for every layout of a space), writes one record and reads the journal back
before the next. An exhaustive search stores tens of thousands of finished trials; on the Qwen3-30B-A3B
space (43,194) that cost ~235 us a trial in this process, which the workers cannot share.

``add_finished`` writes the records ``JournalStorage.create_new_trial`` writes (Optuna 5.0,
optuna/storages/journal/_storage.py: the CREATE_TRIAL operation with the template trial's fields; the
journal file is Optuna's documented, persisted format, read back by any later Optuna), each distribution
serialised once, all of a batch in one write, then lets the storage read them back once. A test checks that
a study stored this way reads back equal to one stored by ``add_trials``. Other storages use ``add_trials``.

Reading the records back, Optuna's journal replay parses every distribution of every trial from its JSON
(``json_to_distribution``: ~17 a trial, ~5% of the search's own process on the Qwen3-235B-A22B recipe space);
``parse_once`` makes that replay parse each distinct JSON string once (the distribution is a pure function of
the string, and Optuna never changes a distribution: its trials share theirs already when stored by
``add_trials``). Only the replay's name is replaced; what is read is the same.
"""

from __future__ import annotations

from datetime import timezone
from typing import Any

import optuna.storages.journal._storage as _replay
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import FrozenTrial

from echo_tune.identity_cache import IdentityCache

CREATE_TRIAL = 4
"""optuna.storages.journal._storage.JournalOperation.CREATE_TRIAL (a persisted value: old journals keep it)."""
WORKER_ID = "echo-tune-exhaustive"
"""The records' writer (Optuna uses it only to find the RUNNING trial a process owns; these are finished)."""


_PARSED = IdentityCache(limit=4096)  # json_to_distribution by its string


def _parsed(text: str):
    """``json_to_distribution(text)``, parsed once per string (at most 4096 kept)."""
    return _PARSED.get((), (text,), lambda: json_to_distribution(text))


def parse_once() -> None:
    """Optuna's journal replay (``optuna/storages/journal/_storage.py``, which imports ``json_to_distribution``
    by name) parses through ``_parsed``."""
    if getattr(_replay, "json_to_distribution", None) is json_to_distribution:
        _replay.json_to_distribution = _parsed


def _stamp(moment) -> str | None:
    return None if moment is None else moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


def creation_records(study_id: int, worker_id: str, trials: list[FrozenTrial]) -> list[dict[str, Any]]:
    """The journal records that create ``trials`` (finished) in study ``study_id``."""
    as_json: dict[int, tuple[Any, str]] = {}  # id(distribution) -> (it, its JSON): computed once per object

    def dumped(distribution) -> str:
        entry = as_json.get(id(distribution))
        if entry is None:
            entry = as_json[id(distribution)] = (distribution, distribution_to_json(distribution))
        return entry[1]

    records = []
    for trial in trials:
        several = trial.values is not None and len(trial.values) > 1
        record = {"op_code": CREATE_TRIAL, "worker_id": worker_id, "study_id": study_id,
                  "datetime_start": _stamp(trial.datetime_start), "state": trial.state,
                  "value": None if several else trial.value, "values": trial.values if several else None}
        if trial.datetime_complete is not None:
            record["datetime_complete"] = _stamp(trial.datetime_complete)
        distributions = trial.distributions
        record["distributions"] = {k: dumped(d) for k, d in distributions.items()}
        record["params"] = {k: distributions[k].to_internal_repr(v) for k, v in trial.params.items()}
        record["user_attrs"] = trial.user_attrs
        record["system_attrs"] = trial.system_attrs
        record["intermediate_values"] = trial.intermediate_values
        records.append(record)
    return records


def add_finished(store, study, trials: list[FrozenTrial]) -> None:
    """Store finished ``trials`` (from ``optuna.trial.create_trial``, so validated) in ``study``: as one
    batch of journal records where ``store`` is our journal, else through ``study.add_trials``."""
    if store.journal is None or not trials:
        study.add_trials(trials)
        return
    parse_once()
    storage = store.storage
    study_id = storage.get_study_id_from_name(study.study_name)
    with store.batch():
        store.journal.append_logs(creation_records(study_id, WORKER_ID, trials))
        storage.get_study_system_attrs(study_id)  # reads the batch back (from memory, not parsed from the file)

