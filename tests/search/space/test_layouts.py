"""The sampler and the enumerator draw from one definition of the space and agree on it."""

from __future__ import annotations

import itertools

import optuna
import pytest
from optuna.trial import TrialState

from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.errors import ConfigError
from echo_tune.search import check_space, enumerate_layouts, space_from_dict, suggest_layout
from echo_tune.search.space.layouts import RejectedLayout, applicable, off_value
from echo_tune.search.space.baselines import baselines
from echo_tune.search.space.params import full_params, layout_of
from echo_tune.search.engines.sampler import ValidLayoutSampler
from echo_tune.search.space.search_space import FIELD_ORDER

TINY = {"model": "gpt-1.7b", "cluster": "a100-80gb", "num_gpus": 16, "global_batch_size": 64,
        "layout": {"tensor_model_parallel_size": "auto", "pipeline_model_parallel_size": [1, 2, 3, 4, 8],
                   "micro_batch_size": [1, 2, 4, 8], "virtual_pipeline_model_parallel_size": [1, 2, 4],
                   "sequence_parallel": "auto", "recompute_granularity": ["none", "full"],
                   "recompute_method": ["uniform", "block"], "use_distributed_optimizer": "auto",
                   "overlap_param_gather": "auto", "overlap_grad_reduce": "auto"}}


@pytest.fixture(scope="module")
def tiny():
    return space_from_dict(TINY, name="tiny")


def brute_force(space) -> set[tuple]:
    """Every combination of listed values, settings without effect switched off, kept if check_compatible
    accepts it: the space's definition written out without the enumerator's pruning."""
    keys = set()
    for values in itertools.product(*(space.choices[f] for f in FIELD_ORDER)):
        chosen = {}
        for f, v in zip(FIELD_ORDER, values):
            chosen[f] = v if applicable(f, chosen, space.model) else off_value(space, f)
        from echo_tune.config.specs.parallel import ParallelConfig
        from echo_tune.search.space.features import model_of
        from echo_tune.search.space.fields import MODEL_LAYOUT_FIELDS, MODULE_SET_FIELDS, module_set
        parallel = ParallelConfig(global_batch_size=space.global_batch_size, precision=space.precision,
                                  **{f: module_set(chosen[f]) if f in MODULE_SET_FIELDS else chosen[f]
                                     for f in FIELD_ORDER[1:] if f not in MODEL_LAYOUT_FIELDS})
        try:
            model = model_of(space, chosen)
            check_compatible(model, space.cluster, chosen["num_gpus"], parallel)
        except ConfigError:
            continue
        keys.add(tuple(sorted({"num_gpus": chosen["num_gpus"], **parallel.to_dict(),
                               **{f: getattr(model, f) for f in MODEL_LAYOUT_FIELDS}}.items())))
    return keys


def test_enumerator_is_exactly_the_valid_space(tiny):
    enumerated = [c.key for c in enumerate_layouts(tiny)]
    assert len(enumerated) == len(set(enumerated))  # no duplicates
    assert set(enumerated) == brute_force(tiny)


def test_every_trial_draw_is_enumerated_or_rejected_with_a_rule(tiny):
    valid = {c.key for c in enumerate_layouts(tiny)}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    rejected = 0
    for _ in range(300):
        trial = study.ask()
        try:
            assert suggest_layout(trial, tiny).key in valid
            study.tell(trial, 1.0)
        except RejectedLayout as exc:
            rejected += 1
            assert "must hold" in exc.rule or "needs" in exc.rule
            study.tell(trial, state=TrialState.PRUNED)
    assert rejected > 0  # the tiny space does hold invalid combinations


def test_full_params_round_trip(tiny):
    for c in enumerate_layouts(tiny):
        params = full_params(tiny, c)
        assert set(params) == set(tiny.searched)
        assert layout_of(tiny, params).key == c.key


@pytest.mark.parametrize("base", ["tpe", "random", "nsga2"])
def test_valid_layout_sampler_proposes_valid_new_layouts(tiny, base):
    valid, _ = check_space(tiny)
    make = {"tpe": lambda: optuna.samplers.TPESampler(seed=0, multivariate=True),
            "random": lambda: optuna.samplers.RandomSampler(seed=0),
            "nsga2": lambda: optuna.samplers.NSGAIISampler(seed=0, population_size=10)}[base]
    study = optuna.create_study(sampler=ValidLayoutSampler(make(), tiny, valid, seed=0))
    seen = set()
    for _ in range(40):
        trial = study.ask()
        candidate = suggest_layout(trial, tiny)  # never raises: proposals are valid
        assert candidate.key not in seen
        seen.add(candidate.key)
        study.tell(trial, candidate.parallel.pipeline_model_parallel_size + candidate.parallel.micro_batch_size)


def test_baselines_take_the_largest_tp_inside_a_node(tiny):
    valid, _ = check_space(tiny)
    picks = baselines(tiny, valid)
    assert picks and all(c.parallel.tensor_model_parallel_size == 8 for c in picks)
    assert len({c.parallel.pipeline_model_parallel_size for c in picks}) == len(picks)
    assert all(c.parallel.use_distributed_optimizer and c.parallel.sequence_parallel for c in picks)


def test_param_gather_overlap_is_off_where_no_gradient_is_reduced():
    # at DP 1 the search turned overlap_grad_reduce off but kept overlap_param_gather: a launch line Megatron-LM
    # refuses ('Must use --overlap-param-gather with --overlap-grad-reduce')
    dp1 = {"num_gpus": 8, "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 2,
           "context_parallel_size": 1, "use_distributed_optimizer": True}
    assert not applicable("overlap_grad_reduce", dp1) and not applicable("overlap_param_gather", dp1)
    assert applicable("overlap_param_gather", {**dp1, "num_gpus": 16})
    # routed experts reduce over the expert-data-parallel group, which exceeds one at DP 1 here (TP4 EP2 ETP1)
    moe = {**dp1, "num_gpus": 4, "pipeline_model_parallel_size": 1, "expert_model_parallel_size": 2,
           "expert_tensor_parallel_size": 1}
    assert applicable("overlap_grad_reduce", moe) and applicable("overlap_param_gather", moe)
    assert not applicable("overlap_grad_reduce", {**moe, "expert_tensor_parallel_size": None})  # EDP 4/(2*4)
