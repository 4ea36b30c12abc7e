"""``Freezer`` builds the trials ``optuna.trial.create_trial`` builds (engines/freeze.py)."""

from __future__ import annotations

import warnings

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution, IntUniformDistribution
from optuna.trial import TrialState, create_trial

from echo_tune.search.engines.freeze import Freezer

DISTRIBUTIONS = {"tensor_model_parallel_size": IntDistribution(1, 8, log=True),
                 "recompute_granularity": CategoricalDistribution([None, "selective", "full"])}
PARAMS = {"tensor_model_parallel_size": 2, "recompute_granularity": "full"}


def _fields(trial):
    return {k: v for k, v in vars(trial).items() if k not in ("_datetime_start", "datetime_complete")}


def _both(distributions, **kwargs):
    kwargs_theirs = dict(kwargs, system_attrs=dict(kwargs["system_attrs"]))  # create_trial writes into it
    theirs = create_trial(distributions=distributions if kwargs.get("params") else None, **kwargs_theirs)
    ours = Freezer(distributions)(**kwargs)
    return ours, theirs


@pytest.mark.parametrize("kwargs", [
    dict(state=TrialState.COMPLETE, values=[1.5], params=PARAMS, user_attrs={"record": {"x": 1}},
         system_attrs={"constraints": (0.0,)}, constraints={"memory_overshoot_gib": 0.0}),
    dict(state=TrialState.COMPLETE, values=[float("inf"), 3.0], params=PARAMS, user_attrs={},
         system_attrs={"constraints": (2.5,)}, constraints={"memory_overshoot_gib": 2.5, "b": 1}),
    dict(state=TrialState.PRUNED, params=PARAMS, user_attrs={"rejected_rule": "r"},
         system_attrs={"constraints": (1e6,)}, constraints={"breaks_rule": 1e6}),
    dict(state=TrialState.PRUNED, params={}, user_attrs={"dominated_by": "r"},
         system_attrs={"constraints": (1e6,)}, constraints={"breaks_rule": 1e6}),
])
def test_same_trial_as_create_trial(kwargs):
    ours, theirs = _both(DISTRIBUTIONS, **kwargs)
    assert _fields(ours) == _fields(theirs)
    assert list(ours.system_attrs) == list(theirs.system_attrs)  # the order the journal writes
    assert ours.datetime_start == ours.datetime_complete is not None
    assert ours.distributions is not Freezer(DISTRIBUTIONS)._distributions  # each trial its own dict


def test_deprecated_distributions_converted_once():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        old = {"tensor_model_parallel_size": IntUniformDistribution(1, 8)}
        ours, theirs = _both(old, state=TrialState.COMPLETE, values=[1.0], params={"tensor_model_parallel_size": 2},
                             user_attrs={}, system_attrs={"c": 1}, constraints={})
    assert _fields(ours) == _fields(theirs)
    assert isinstance(ours.distributions["tensor_model_parallel_size"], IntDistribution)


@pytest.mark.parametrize("kwargs, error", [
    (dict(state=TrialState.COMPLETE, values=[float("nan")], params=PARAMS), ValueError),  # validated
    (dict(state=TrialState.COMPLETE, values=[1.0], params={**PARAMS, "recompute_granularity": "x"}), ValueError),
    (dict(state=TrialState.COMPLETE, values=[1.0], params=PARAMS, constraints={"a": float("nan")}), ValueError),
])
def test_invalid_trials_refused_as_create_trial_refuses_them(kwargs, error):
    kwargs = {"user_attrs": {}, "system_attrs": {"s": 1}, "constraints": {}, **kwargs}
    with pytest.raises(error):
        create_trial(distributions=DISTRIBUTIONS, **dict(kwargs, system_attrs=dict(kwargs["system_attrs"])))
    with pytest.raises(error):
        Freezer(DISTRIBUTIONS)(**kwargs)
