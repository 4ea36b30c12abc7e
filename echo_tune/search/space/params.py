"""How a layout is written as Optuna parameters, one per searched Megatron setting.

* Numeric settings (GPU count, TP, PP, CP, micro-batch size, virtual stages, recompute layers) are
  ``IntDistribution(low, high, log=True)`` over their listed values: TPE then models them with kernels on
  a log scale and learns that neighbouring sizes behave alike (PP 24 good -> try PP 48), which a
  categorical cannot. A proposal between listed values is snapped to the nearest listed one (in log
  space) before it is used, so the stored param always is the layout's value. Virtual stages use 1 for
  "no interleaving".
* The others (booleans, recompute granularity and method, settings listing ``none``) are categoricals
  over their listed values.

Every trial suggests every searched setting, so its distributions never change and samplers can model
all of them jointly; settings without effect in the drawn layout are ignored by ``draw``.
"""

from __future__ import annotations

import math

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from echo_tune.search.space.layouts import Candidate, applicable, draw, off_value, setting
from echo_tune.search.space.search_space import SearchSpace

VPP = "virtual_pipeline_model_parallel_size"


def to_param(field_name: str, value):
    return 1 if field_name == VPP and value is None else value


def from_param(field_name: str, value):
    return None if field_name == VPP and value == 1 else value


def numeric_values(space: SearchSpace, field_name: str) -> list[int] | None:
    """The sorted listed values as parameters, if they are all positive integers; else None."""
    values = [to_param(field_name, v) for v in space.choices[field_name]]
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        return sorted(values)
    return None


def search_distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """The distribution of every searched setting (the same in every trial of the space)."""
    out: dict[str, BaseDistribution] = {}
    for f in space.searched:
        values = numeric_values(space, f)
        out[f] = IntDistribution(values[0], values[-1], log=True) if values else CategoricalDistribution(
            space.choices[f])
    return out


def snap(space: SearchSpace, field_name: str, value):
    """A numeric param moved to the nearest listed value (log scale); other params unchanged."""
    values = numeric_values(space, field_name)
    if not values or value in values:
        return value
    return min(values, key=lambda v: (abs(math.log(v) - math.log(max(value, 1))), v))


def snap_params(space: SearchSpace, params: dict) -> dict:
    return {f: snap(space, f, v) for f, v in params.items()}


def layout_of(space: SearchSpace, params: dict) -> Candidate:
    """The layout a full set of params stands for (RejectedLayout if invalid, KeyError if incomplete)."""
    return draw(space, lambda name, values: from_param(name, snap(space, name, params[name])))


def full_params(space: SearchSpace, candidate: Candidate) -> dict:
    """A param for every searched setting: the layout's value where it applies, a filler (its off value,
    else its first listed value) where it has no effect."""
    chosen = candidate._config  # {"num_gpus": ..., every setting}, built once per candidate (read only here)
    out = {}
    for f in space.searched:
        if applicable(f, chosen, space.model):
            value = setting(candidate, f)
        else:
            off = off_value(space, f)
            value = off if off in space.choices[f] else space.choices[f][0]
        out[f] = to_param(f, value)
    return out


def suggest_layout(trial, space: SearchSpace) -> Candidate:
    """Draw a layout through an Optuna trial, one parameter per searched setting named by Megatron.

    Raises RejectedLayout (with check_compatible's rule) when the combination is invalid.
    """
    params = {}
    for f, dist in search_distributions(space).items():
        if isinstance(dist, IntDistribution):
            params[f] = trial.suggest_int(f, dist.low, dist.high, log=True)
        else:
            params[f] = trial.suggest_categorical(f, dist.choices)
    return layout_of(space, params)
