"""Finished trials stored as one batch of journal records read back as Optuna's own ``add_trials`` stores them."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState, create_trial

from echo_tune.search.storage.journal_trials import add_finished
from echo_tune.search.storage.study_storage import open_storage

DISTRIBUTIONS = {"tensor_model_parallel_size": IntDistribution(1, 8, log=True),
                 "recompute_granularity": CategoricalDistribution([None, "selective", "full"])}


def _trials():
    out = []
    for i, (tp, rec) in enumerate([(1, None), (2, "full"), (8, "selective")]):
        params = {"tensor_model_parallel_size": tp, "recompute_granularity": rec}
        if i == 2:  # a rejected layout: pruned, no value
            out.append(create_trial(state=TrialState.PRUNED, params=params, distributions=DISTRIBUTIONS,
                                    user_attrs={"rejected_rule": "r"}))
        else:
            out.append(create_trial(state=TrialState.COMPLETE, value=1.5 + i, params=params,
                                    distributions=DISTRIBUTIONS, user_attrs={"record": {"step_time_s": 1.5 + i}},
                                    system_attrs={"constraints": [0.0]}))
    return out


def _fields(trial):
    return (trial.number, trial.state, trial.values, trial.params, trial.distributions, trial.user_attrs,
            trial.system_attrs, trial.datetime_start, trial.datetime_complete, trial.intermediate_values)


def test_batched_records_read_back_equal_to_optunas_own(tmp_path):
    trials = _trials()
    ours = open_storage(tmp_path / "ours")
    study = optuna.create_study(study_name="s", storage=ours.storage)
    add_finished(ours, study, trials[:2])
    add_finished(ours, study, trials[2:])
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]

    theirs = open_storage(tmp_path / "theirs")
    reference = optuna.create_study(study_name="s", storage=theirs.storage)
    reference.add_trials(trials)

    # read back by a fresh process's storage, and by Optuna's own journal backend (the file format)
    for path in ("ours", "theirs"):
        assert (tmp_path / path / "journal.log").exists()
    mine = optuna.load_study(study_name="s", storage=open_storage(tmp_path / "ours").storage).get_trials()
    plain = optuna.load_study(study_name="s", storage=JournalStorage(
        JournalFileBackend(str(tmp_path / "ours" / "journal.log")))).get_trials()
    expected = optuna.load_study(study_name="s", storage=open_storage(tmp_path / "theirs").storage).get_trials()
    assert [_fields(t) for t in mine] == [_fields(t) for t in expected] == [_fields(t) for t in plain]
    assert [_fields(t) for t in study.get_trials()] == [_fields(t) for t in expected]  # the writer's own view


def test_other_storages_take_optunas_path(tmp_path):
    store = open_storage(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}")
    study = optuna.create_study(study_name="s", storage=store.storage)
    add_finished(store, study, _trials())
    assert [t.params for t in study.get_trials()] == [t.params for t in _trials()]


def test_several_objectives_keep_their_values(tmp_path):
    trial = create_trial(state=TrialState.COMPLETE, values=[1.5, 30.0], params={"tensor_model_parallel_size": 2},
                         distributions={"tensor_model_parallel_size": DISTRIBUTIONS["tensor_model_parallel_size"]})
    store = open_storage(tmp_path)
    study = optuna.create_study(study_name="s", storage=store.storage, directions=["minimize", "minimize"])
    add_finished(store, study, [trial])
    back = optuna.load_study(study_name="s", storage=open_storage(tmp_path).storage).get_trials()
    assert back[0].values == [1.5, 30.0]


def test_replay_parses_each_distribution_once_and_reads_the_same(tmp_path, monkeypatch):
    import optuna.storages.journal._storage as replay
    from optuna.distributions import json_to_distribution

    from echo_tune.search.storage import journal_trials

    store = open_storage(tmp_path)
    study = optuna.create_study(study_name="s", storage=store.storage)
    add_finished(store, study, _trials())
    assert replay.json_to_distribution is journal_trials._parsed  # installed once, by the first batch
    journal_trials.parse_once()
    assert replay.json_to_distribution is journal_trials._parsed
    cached = optuna.load_study(study_name="s", storage=open_storage(tmp_path).storage).get_trials()
    assert cached[0].distributions["recompute_granularity"] is cached[1].distributions["recompute_granularity"]
    monkeypatch.setattr(replay, "json_to_distribution", json_to_distribution)  # Optuna's own parse, every time
    plain = optuna.load_study(study_name="s", storage=open_storage(tmp_path).storage).get_trials()
    assert [_fields(t) for t in cached] == [_fields(t) for t in plain]
