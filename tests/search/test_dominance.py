"""Dominated layouts (search/dominance.py): the rule checked against every layout simulated, and the searches
that skip them keep the optimum."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from echo_tune.search import SearchOptions, check_space, load_space, run_search
from echo_tune.search.dominance import DOMINATED_BY_RECOMPUTE, Dominance, group_key, ordered_groups
from echo_tune.search.exhaustive import _evaluate_batch, _pieces_for, batches
from echo_tune.search.layouts import RejectedLayout
from echo_tune.search.objective import evaluate

from .conftest import SPACES


def _simulate_all(space) -> dict:
    """Every valid layout of ``space`` simulated: key -> (candidate, record or None when rejected)."""
    out = {}
    for c in check_space(space)[0]:
        try:
            out[c.key] = (c, evaluate(space, c)[0])
        except RejectedLayout:
            out[c.key] = (c, None)
    return out


@pytest.fixture(scope="module")
def small_all(small_space):
    return _simulate_all(small_space)


@pytest.mark.parametrize("space_file", ["small-gpt7b-16xa100.yaml", "mixtral-8x7b-64xh100.yaml"])
def test_no_recompute_variant_is_faster_than_the_same_layout_without_recompute_that_fits(space_file, small_all):
    """The rule against exhaustive: over every layout of a dense and a MoE space (simulated, none skipped),
    a recompute variant of a layout that fits without recompute is never faster. Both spaces hold such
    groups, so the check cannot pass empty."""
    space = load_space(SPACES / space_file)
    results = small_all if space.name == "small-gpt7b-16xa100" else _simulate_all(space)
    groups = ordered_groups(c for c, _ in results.values())
    checked = 0
    for members in groups:
        head = results[members[0].key][1]
        if members[0].parallel.recompute_granularity is not None or head is None or not head["fits_memory"]:
            continue
        for c in members[1:]:
            record = results[c.key][1]
            assert c.parallel.recompute_granularity is not None
            if record is not None:
                assert record["step_time_s"] >= head["step_time_s"] * (1 - 1e-12), (c.config, members[0].config)
                checked += 1
    assert checked >= 50


def test_exhaustive_skips_the_dominated_layouts_and_finds_the_same_optimum(small_space, small_all, small_exhaustive):
    fitting = [(r["step_time_s"], c.key) for c, r in small_all.values() if r is not None and r["fits_memory"]]
    optimum = min(fitting)[0]
    assert small_exhaustive.best["step_time_s"] == pytest.approx(optimum, rel=1e-12)
    # exactly the recompute variants of layouts that fit without recompute were skipped
    expected = 0
    for members in ordered_groups(c for c, _ in small_all.values()):
        head = small_all[members[0].key][1]
        if members[0].parallel.recompute_granularity is None and head is not None and head["fits_memory"]:
            expected += len(members) - 1
    assert small_exhaustive.n_dominated == expected > 0
    assert small_exhaustive.n_trials == len(small_all) and small_exhaustive.coverage == 1.0
    trials = pd.read_csv(f"{small_exhaustive.results_dir}/trials.csv", keep_default_na=False)
    skipped = trials[trials["dominated_by"] != ""]
    assert len(skipped) == expected and set(skipped["dominated_by"]) == {DOMINATED_BY_RECOMPUTE}
    assert set(skipped["state"]) == {"PRUNED"} and (skipped["rejected_rule"] == "").all()
    assert (skipped["recompute_granularity"] != "none").all()


def test_batches_keep_a_layouts_recompute_variants_together_after_it(small_space):
    valid, _ = check_space(small_space)
    for n_jobs in (1, 2, 7):
        parts = batches(valid, n_jobs)
        where = {}
        for i, part in enumerate(parts):
            for c in part:
                where.setdefault(group_key(c), set()).add(i)
        assert all(len(batch_ids) == 1 for batch_ids in where.values())
        for part in parts:
            seen = set()
            for c in part:
                if c.parallel.recompute_granularity is None:
                    assert group_key(c) not in seen  # the layout without recompute comes first
                seen.add(group_key(c))


def test_a_batch_marks_only_variants_of_a_fitting_layout_and_none_when_memory_is_an_objective(small_space,
                                                                                                  small_all):
    valid, _ = check_space(small_space)
    group = next(m for m in ordered_groups(valid) if len(m) == 3 and m[0].parallel.recompute_granularity is None
                 and small_all[m[0].key][1]["fits_memory"])
    trials = _evaluate_batch(small_space, group, None, _pieces_for(small_space, group))
    assert [t.state.name for t in trials] == ["COMPLETE", "PRUNED", "PRUNED"]
    assert [t.user_attrs.get("dominated_by") for t in trials] == [None] + [DOMINATED_BY_RECOMPUTE] * 2
    # the variants alone (their dominator not in the batch): simulated
    assert all(t.state.name == "COMPLETE" for t in _evaluate_batch(small_space, group[1:], None,
                                                                   _pieces_for(small_space, group[1:])))
    # a layout over memory dominates nothing
    over = next(m for m in ordered_groups(valid) if len(m) > 1 and m[0].parallel.recompute_granularity is None
                and small_all[m[0].key][1] is not None and not small_all[m[0].key][1]["fits_memory"])
    assert all(t.state.name == "COMPLETE" for t in _evaluate_batch(small_space, over, None,
                                                                   _pieces_for(small_space, over)))
    memory = dataclasses.replace(small_space, objectives=("step_time", "peak_memory"))
    assert not Dominance(memory).active and Dominance(small_space).active
    assert all(t.state.name == "COMPLETE" for t in _evaluate_batch(memory, group, None, _pieces_for(memory, group)))


def test_a_peak_memory_search_simulates_every_layout(small_space, tmp_path):
    space = dataclasses.replace(small_space, objectives=("step_time", "peak_memory"))
    result = run_search(space, SearchOptions(sampler="exhaustive", results_dir=tmp_path, write_files=False))
    assert result.n_dominated == 0 and result.n_trials == len(check_space(space)[0])


@pytest.mark.parametrize("space_file", ["small-gpt7b-16xa100.yaml", "mixtral-8x7b-64xh100.yaml"])
def test_checking_after_interleaving_keeps_the_same_valid_layouts(space_file, monkeypatch):
    """The partial check after the interleaving settings only skips what the complete check would reject."""
    from echo_tune.search import layouts

    space = load_space(SPACES / space_file)
    with_it = [c.key for c in layouts.enumerate_layouts(space)]
    monkeypatch.setattr(layouts, "CHECK_AFTER", (layouts.SHAPE_FIELDS[-1],))
    without = [c.key for c in layouts.enumerate_layouts(space)]
    assert with_it == without and len(with_it) > 100


def test_the_collector_is_paused_inside_and_restored_after():
    import gc

    from echo_tune.search.gc_pause import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # off before: left off
    finally:
        gc.enable()


def test_the_summary_says_how_many_layouts_were_not_simulated(tmp_path, capsys):
    from echo_tune.cli.main import main

    assert main(["search", str(SPACES / "small-gpt7b-16xa100.yaml"), "--sampler", "exhaustive",
                 "--results-dir", str(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "not simulated (the same layout without recompute fits, and recompute only adds work)" in out
    assert "valid layouts in the space covered (100.0%)" in out


def test_a_resumed_sampler_does_not_propose_a_dominated_layout_again(small_space, tmp_path):
    """Dominated trials have no params; a wrapped sampler resumed on the study knows them by their config."""
    run_search(small_space, SearchOptions(n_trials=300, results_dir=tmp_path))
    result = run_search(small_space, SearchOptions(sampler="random", seed=0, n_trials=744, resume=True,
                                                   results_dir=tmp_path, write_files=False))
    import optuna

    from echo_tune.search.storage import open_storage

    study = optuna.load_study(study_name=small_space.name,
                              storage=open_storage(tmp_path / small_space.name, None).storage)
    keys = [tuple(sorted((t.user_attrs.get("record") or t.user_attrs)["config"].items()))
            for t in study.get_trials(deepcopy=False)]
    assert result.n_dominated > 0 and len(keys) == len(set(keys)) == len(check_space(small_space)[0])


def test_no_layout_is_skipped_with_a_profile_whose_dp_tail_is_not_monotone(small_space):
    from echo_tune.cost.profile import profile_for
    from echo_tune.search.dominance import applies

    profile = profile_for(small_space.cluster)
    assert applies(small_space, profile) and applies(small_space)
    steep = dataclasses.replace(profile, compute_slowdown=2.5, comm_slowdown=1.5)  # 1.5 >= 1 / 1.5
    assert not applies(small_space, steep) and not Dominance(small_space, steep).active


@pytest.mark.parametrize("pct", [3.0, 20.0])
def test_the_near_tie_check_sees_the_recompute_variants_it_needs(small_space, small_all, small_exhaustive, pct):
    """The safer near-tie is often the winner with recompute, which the search did not simulate: the check
    simulates the variants near the best and names the same layout as with every layout simulated."""
    from echo_tune.plan.safety import near_tie

    every = [r for _, r in small_all.values() if r is not None]
    found = near_tie(small_exhaustive.records, pct, small_space)
    expected = near_tie(every, pct)
    assert (found is None) == (expected is None)
    if expected is not None:
        assert found["config"] == expected["config"]
    if pct == 20.0:  # the case the skipped layouts changed
        assert expected is not None and expected["config"]["recompute_granularity"] is not None
