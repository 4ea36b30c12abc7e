"""The default search's feature level (search/engines/feature_level.py): after the features are swept, the best
structures' batch settings (virtual pipeline stages, recompute, overlaps) are searched again with their features; and
the first level's interleaved representative (auto.py)."""

from __future__ import annotations

import pytest

from echo_tune.search.engines.auto import groups, representatives, search_rounds, structure
from echo_tune.search.engines.feature_level import rebatch
from echo_tune.search.engines.feature_variants import SWEEP_FIELDS, core_space, variants
from echo_tune.search.space.auto_space import auto_space
from echo_tune.search.space.space_check import check_space


@pytest.fixture(scope="module")
def space():
    """Qwen3-30B-A3B on 16 H100 with the recipe features, narrowed to TP1 PP2 CP1 mbs1: 8 structures of 24
    batch settings each (VPP x recompute) at the lead features."""
    return auto_space("qwen3-30b-a3b", "h100", 16, 512, seq_length=4096, fp8_format="auto",
                      layout={"context_parallel_size": 1, "micro_batch_size": 1, "tensor_model_parallel_size": 1,
                              "pipeline_model_parallel_size": 2})


@pytest.fixture(scope="module")
def core(space):
    valid, _ = check_space(core_space(space))
    return valid, groups(valid)


def _batch(c) -> tuple:
    p = c.parallel
    return p.virtual_pipeline_model_parallel_size, p.recompute_granularity, p.tp_comm_overlap


def _features(c) -> tuple:
    return tuple(c._config[f] for f in SWEEP_FIELDS)


def test_the_best_swept_structures_get_every_batch_setting_with_their_features(space, core):
    valid, members = core
    fp8 = [s for s in members if s[-2] == "hybrid"]  # STRUCTURE_FIELDS: fp8_format second to last
    first, second = (min(members[s], key=lambda c: (_batch(c)[0] or 1, str(_batch(c)))) for s in fp8[:2])
    # each swept to features other than its lead ones (the first level's)
    swept = [next(v for v in variants(space, c, SWEEP_FIELDS) if _features(v) != _features(c))
             for c in (first, second)]
    scores = {first.key: 3.0, second.key: 2.5, swept[0].key: 1.0, swept[1].key: 2.0}
    out = rebatch(space, swept, scores, 10_000, structure, members)
    assert len({c.key for c in out}) == len(out) and not any(c.key in scores for c in out)
    head = [c for c in out if structure(c) == structure(first)]
    assert out[:len(head)] == head  # the best structure first, whole
    assert {_batch(c) for c in head} | {_batch(swept[0])} == {_batch(c) for c in members[structure(first)]}
    assert {_features(c) for c in out[:len(head)]} == {_features(swept[0])}
    assert {structure(c) for c in out[len(head):]} == {structure(second)}
    assert {_features(c) for c in out[len(head):]} == {_features(swept[1])}
    assert [c.key for c in rebatch(space, swept, scores, 5, structure, members)] == [c.key for c in out[:5]]
    # a layout that does not fit ranks no structure
    assert rebatch(space, swept, {**scores, swept[0].key: None, swept[1].key: None}, 100, structure, members) == []


def _made_up(c) -> float | None:
    """Made-up step times: fewer the more experts per GPU, over memory at full recompute."""
    p = c.parallel
    if p.recompute_granularity == "full":
        return None
    return 10.0 / p.expert_model_parallel_size + (p.virtual_pipeline_model_parallel_size or 1) / 100 + (
        0.5 if c._config["moe_flex_dispatcher_backend"] == "deepep" else 0.0)


class _Stop(Exception):
    pass


def _rounds(space, valid, budget: int, known: dict | None = None, stop_after: int | None = None) -> list:
    """The layouts search_rounds simulates, in order, on made-up scores (``known``: stored before)."""
    known = {} if known is None else known
    order = []

    def simulate(todo):
        for c in todo:
            assert c.key not in known  # a stored layout is read back, not simulated again
            if stop_after is not None and len(order) >= stop_after:
                raise _Stop
            known[c.key] = _made_up(c)
            order.append(c.key)
        return bool(todo)
    try:
        search_rounds(space, valid, budget, lambda: dict(known), simulate)
    except _Stop:
        pass
    return order


def test_rounds_stay_within_the_budget_repeat_and_resume_to_the_same_layouts(space, core):
    valid, _ = core
    order = _rounds(space, valid, 120)
    assert len(order) == 120 and order == _rounds(space, valid, 120)
    keys = {c.key: c for c in valid}
    assert any(k not in keys for k in order)  # the feature level ran
    for stop in (30, 95, 100, 110):  # in the first level and in the feature level's steps
        known: dict = {}
        first = _rounds(space, valid, 120, known, stop_after=stop)
        assert len(first) == stop
        assert set(first + _rounds(space, valid, 120, known)) == set(order)


def test_a_pipeline_structure_is_also_tried_at_its_middle_virtual_stages(core):
    """auto.representatives: beside the fastest, lightest and typical layouts (all without interleaving), the typical
    one at the middle of the structure's virtual-stage counts (the EP overlap needs interleaving)."""
    _, members = core
    for s, m in members.items():
        stages = sorted({c.parallel.virtual_pipeline_model_parallel_size for c in m} - {None})
        reps = representatives(m)
        assert len(reps) == 4 and len({c.key for c in reps}) == 4
        interleaved = [c for c in reps if c.parallel.virtual_pipeline_model_parallel_size]
        assert [c.parallel.virtual_pipeline_model_parallel_size for c in interleaved] == [stages[len(stages) // 2]]
        assert interleaved[0].parallel.recompute_granularity == "selective"
