"""Finished trials built as ``optuna.trial.create_trial`` builds them, for the exhaustive search's every layout.

``create_trial`` (Optuna 5.x, optuna/trial/_frozen.py) converts each distribution of each trial from the
deprecated classes, comparing each with its conversion (a CategoricalDistribution's ``__eq__`` builds two
dicts): ~46 us a trial on the Qwen3-235B-A22B recipe space's 17 distributions, ~40 of them the conversion.
``Freezer`` converts a space's distributions once and builds each trial as ``create_trial`` does from them
(the same fields in the same order; still validated by ``FrozenTrial._validate``, ~6 us);
``tests/search/engines/test_freeze.py`` compares its trials with ``create_trial``'s field by field.
"""

from __future__ import annotations

import datetime
import math

from optuna.distributions import _convert_old_distribution_to_new_distribution
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY
from optuna.trial import FrozenTrial, TrialState, create_trial


class Freezer:
    """``create_trial(state=..., values=..., params=..., distributions=distributions, user_attrs=...,
    system_attrs=..., constraints=...)`` for trials whose distributions are ``distributions`` (or none)."""

    def __init__(self, distributions: dict):
        self._given = distributions
        self._distributions = {k: _convert_old_distribution_to_new_distribution(d) for k, d in distributions.items()}

    def __call__(self, *, state: TrialState, params: dict | None, user_attrs: dict, system_attrs: dict,
                 constraints: dict, values: list[float] | None = None) -> FrozenTrial:
        keys = [f"{_CONSTRAINTS_KEY}:{key}" for key in constraints]
        floats = [float(value) for value in constraints.values()]
        if any(math.isnan(v) for v in floats) or any(k in system_attrs for k in keys) or len(set(keys)) < len(keys):
            # create_trial's own errors and warnings
            return create_trial(state=state, values=values, params=params,
                                distributions=self._given if params else None, user_attrs=user_attrs,
                                system_attrs=system_attrs, constraints=constraints)
        params = params or {}
        start = datetime.datetime.now()
        trial = FrozenTrial(number=-1, trial_id=-1, state=state, value=None, values=values, datetime_start=start,
                            datetime_complete=start if state.is_finished() else None, params=params,
                            distributions=dict(self._distributions) if params else {}, user_attrs=user_attrs,
                            system_attrs=system_attrs, intermediate_values={})
        system_attrs.update(zip(keys, floats))  # FrozenTrial.set_constraint, in order
        trial._validate()
        return trial
