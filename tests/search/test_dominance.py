"""Dominated layouts (search/space/dominance.py): the rule checked against every layout simulated, and the searches
that skip them keep the optimum."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pandas as pd
import pytest

from echo_tune.search import SearchOptions, check_space, load_space, run_search
from echo_tune.search.space.dominance import (DOMINATED_BY_MEMORY, DOMINATED_BY_RECOMPUTE, OVER_MEMORY, Dominance,
                                              group_key, ordered_groups)
from echo_tune.sim.memory.memory_band import PEAK_OVER_PREDICTION
from echo_tune.search.engines.exhaustive import _evaluate_batch, _pieces_for, batches
from echo_tune.search.space.layouts import RejectedLayout
from echo_tune.search.engines.objective import evaluate
from echo_tune.search.storage.study_storage import open_storage

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


def _over_floor(space, candidate) -> tuple[bool, list[int]]:
    """Whether ``candidate`` is over memory by what recompute does not change, and its stages' floors."""
    record, report = evaluate(space, candidate)
    floors = [m.floor_bytes for m in report.stage_memory]
    return not record["fits_memory"] and max(floors) > report.memory_capacity_bytes, floors


@pytest.mark.parametrize("space_file, min_over", [("small-gpt7b-16xa100.yaml", 2), ("mixtral-8x7b-64xh100.yaml", 2),
                                                   ("gpt3-175b-128xb200-fp8.yaml", 0)])  # FP8: floors all fit
def test_no_recompute_variant_fits_where_the_layout_without_it_is_over_memory_at_its_floor(space_file, min_over,
                                                                                          small_all):
    """The memory rule against exhaustive, on a dense, a MoE and an FP8 space: every recompute variant has the
    same floor (weights, gradients, optimizer states, workspaces, reserve) on every stage as the layout without
    recompute, so where that floor is over the GPU's memory no variant fits."""
    space = load_space(SPACES / space_file)
    results = small_all if space.name == "small-gpt7b-16xa100" else _simulate_all(space)
    over_groups = pairs = 0
    for members in ordered_groups(c for c, _ in results.values()):
        head = results[members[0].key][1]
        if members[0].parallel.recompute_granularity is not None or head is None or len(members) < 2:
            continue
        over, floors = _over_floor(space, members[0])
        for c in members[1:]:
            if results[c.key][1] is None:
                continue
            variant_over, variant_floors = _over_floor(space, c)
            assert variant_floors == floors, (c.config, members[0].config)
            pairs += 1
            if over:
                assert not results[c.key][1]["fits_memory"] and variant_over
        over_groups += over
    assert over_groups >= min_over and pairs >= 30


def test_exhaustive_skips_the_dominated_layouts_and_finds_the_same_optimum(small_space, small_all, small_exhaustive):
    fitting = [(r["step_time_s"], c.key) for c, r in small_all.values() if r is not None and r["fits_memory"]]
    optimum = min(fitting)[0]
    assert small_exhaustive.best["step_time_s"] == pytest.approx(optimum, rel=1e-12)
    # exactly the recompute variants of layouts that fit without recompute were skipped, and those of layouts
    # over memory at their floor
    # over memory, and those over memory by more than the memory model's error (their step not simulated)
    by_rule = {DOMINATED_BY_RECOMPUTE: 0, DOMINATED_BY_MEMORY: 0, OVER_MEMORY: 0}
    for members in ordered_groups(c for c, _ in small_all.values()):
        head = small_all[members[0].key][1]
        skipped = []
        if members[0].parallel.recompute_granularity is None and head is not None:
            if head["fits_memory"]:
                by_rule[DOMINATED_BY_RECOMPUTE] += len(members) - 1
                skipped = members[1:]
            elif _over_floor(small_space, members[0])[0]:
                by_rule[DOMINATED_BY_MEMORY] += len(members) - 1
                skipped = members[1:]
        for c in members:
            record = small_all[c.key][1]
            if c not in skipped and record is not None and \
                    record["peak_memory_bytes"] - record["memory_capacity_bytes"] > \
                    PEAK_OVER_PREDICTION * record["peak_memory_bytes"]:
                by_rule[OVER_MEMORY] += 1
    assert small_exhaustive.n_dominated == by_rule[DOMINATED_BY_RECOMPUTE] + by_rule[DOMINATED_BY_MEMORY]
    assert small_exhaustive.n_untimed == by_rule[OVER_MEMORY] and min(by_rule.values()) > 0
    assert small_exhaustive.n_trials == len(small_all) and small_exhaustive.coverage == 1.0
    trials = pd.read_csv(f"{small_exhaustive.results_dir}/trials.csv", keep_default_na=False)
    skipped = trials[trials["dominated_by"] != ""]
    assert skipped["dominated_by"].value_counts().to_dict() == by_rule
    assert set(skipped["state"]) == {"PRUNED"} and (skipped["rejected_rule"] == "").all()
    dominated = skipped[skipped["dominated_by"] != OVER_MEMORY]
    assert (dominated["recompute_granularity"] != "none").all() and not skipped["feasible"].any()
    # a layout stored over memory carries the peak the whole simulation gives it, and no step time
    peaks = {json.dumps(c.config, sort_keys=True): r["peak_memory_bytes"] for c, r in small_all.values() if r}
    untimed = [t for t in optuna.load_study(study_name=small_exhaustive.study_name, storage=open_storage(
        Path(small_exhaustive.results_dir)).storage).get_trials(deepcopy=False)
        if t.user_attrs.get("dominated_by") == OVER_MEMORY]
    assert len(untimed) == by_rule[OVER_MEMORY]
    assert all(t.user_attrs["memory"]["peak_memory_bytes"] == peaks[json.dumps(t.user_attrs["config"], sort_keys=True)]
               and "step_time_s" not in t.user_attrs["memory"] for t in untimed)


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
    # a layout over memory whose floor fits dominates nothing; one over memory at its floor, its variants
    heads_over = [m for m in ordered_groups(valid) if len(m) > 1 and m[0].parallel.recompute_granularity is None
                  and small_all[m[0].key][1] is not None and not small_all[m[0].key][1]["fits_memory"]]
    over = next(m for m in heads_over if not _over_floor(small_space, m[0])[0])
    trials = _evaluate_batch(small_space, over, None, _pieces_for(small_space, over))
    assert all(t.state.name == "COMPLETE" or t.user_attrs["dominated_by"] == OVER_MEMORY for t in trials)
    assert [t.state.name == "COMPLETE" for t in trials] == [  # untimed: over by more than the memory model's error
        small_all[c.key][1]["peak_memory_bytes"] - small_all[c.key][1]["memory_capacity_bytes"]
        <= PEAK_OVER_PREDICTION * small_all[c.key][1]["peak_memory_bytes"] for c in over]
    floor = next(m for m in heads_over if _over_floor(small_space, m[0])[0])
    trials = _evaluate_batch(small_space, floor, None, _pieces_for(small_space, floor))
    head = small_all[floor[0].key][1]  # over at its floor, so over beyond the band: its memory alone, untimed
    assert head["peak_memory_bytes"] - head["memory_capacity_bytes"] > PEAK_OVER_PREDICTION * head["peak_memory_bytes"]
    # its memory record is enough for the memory rule
    assert [t.user_attrs.get("dominated_by") for t in trials] == [OVER_MEMORY] + [DOMINATED_BY_MEMORY] * (len(floor) - 1)
    memory = dataclasses.replace(small_space, objectives=("step_time", "peak_memory"))
    assert not Dominance(memory).active and Dominance(small_space).active
    for members in (group, floor):  # memory an objective: every layout simulated
        assert all(t.state.name == "COMPLETE"
                   for t in _evaluate_batch(memory, members, None, _pieces_for(memory, members)))


def test_a_peak_memory_search_simulates_every_layout(small_space, tmp_path):
    space = dataclasses.replace(small_space, objectives=("step_time", "peak_memory"))
    result = run_search(space, SearchOptions(sampler="exhaustive", results_dir=tmp_path, write_files=False))
    assert result.n_dominated == 0 and result.n_trials == len(check_space(space)[0])


@pytest.mark.parametrize("space_file", ["small-gpt7b-16xa100.yaml", "mixtral-8x7b-64xh100.yaml"])
def test_checking_after_interleaving_keeps_the_same_valid_layouts(space_file, monkeypatch):
    """The partial check after the interleaving settings only skips what the complete check would reject."""
    from echo_tune.search.space import layouts

    space = load_space(SPACES / space_file)
    with_it = [c.key for c in layouts.enumerate_layouts(space)]
    monkeypatch.setattr(layouts, "CHECK_AFTER", (layouts.SHAPE_FIELDS[-1],))
    without = [c.key for c in layouts.enumerate_layouts(space)]
    assert with_it == without and len(with_it) > 100


def test_the_collector_is_paused_inside_and_restored_after():
    import gc

    from echo_tune.search.engines.gc_pause import gc_paused

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
    result = json.loads((tmp_path / "small-gpt7b-16xa100" / "best.json").read_text())  # written: the run ended
    assert result["trial"] >= 0
    import re
    slower = re.search(r", (\d+) not simulated \(the same layout without recompute fits, and recompute only adds "
                       r"work\)", out)
    cannot_fit = re.search(r", (\d+) not simulated \(the same layout without recompute is over memory in what "
                           r"recompute does not change\)", out)
    assert slower and cannot_fit and int(slower[1]) > 0 and int(cannot_fit[1]) > 0
    assert "valid layouts in the space covered (100.0%)" in out


def test_a_resumed_sampler_does_not_propose_a_dominated_layout_again(small_space, tmp_path):
    """Dominated trials have no params; a wrapped sampler resumed on the study knows them by their config."""
    run_search(small_space, SearchOptions(n_trials=300, results_dir=tmp_path))
    result = run_search(small_space, SearchOptions(sampler="random", seed=0, n_trials=744, resume=True,
                                                   results_dir=tmp_path, write_files=False))
    import optuna

    from echo_tune.search.storage.study_storage import open_storage

    study = optuna.load_study(study_name=small_space.name,
                              storage=open_storage(tmp_path / small_space.name, None).storage)
    keys = [tuple(sorted((t.user_attrs.get("record") or t.user_attrs)["config"].items()))
            for t in study.get_trials(deepcopy=False)]
    assert result.n_dominated > 0 and len(keys) == len(set(keys)) == len(check_space(small_space)[0])


def test_no_layout_is_skipped_with_a_profile_whose_dp_tail_is_not_monotone(small_space):
    from echo_tune.cost.profile import profile_for
    from echo_tune.search.space.dominance import applies

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


def test_where_nothing_fits_the_closest_miss_is_the_one_every_layout_simulated_gives(small_space, tmp_path):
    """The memory rule skips recompute variants, which overflow less than their layout: ``closest_misses``
    simulates those that could beat the least overflow found, so the closest miss is exhaustive's."""
    from echo_tune.search.space.dominance import closest_misses

    space = dataclasses.replace(small_space, memory_headroom_gib=33.0)  # 40 GB A100s, ~4 GiB allowed
    everything = [r for _, r in _simulate_all(space).values() if r is not None]
    assert not any(r["fits_memory"] for r in everything)
    least = min(r["memory_overshoot_bytes"] for r in everything)
    result = run_search(space, SearchOptions(sampler="exhaustive", results_dir=tmp_path, write_files=False))
    assert result.best is None and result.n_dominated > 0
    over = result.records + result.untimed  # simulated, or over by more than the memory model's error: untimed
    assert result.untimed and all("step_time_s" not in r for r in result.untimed)
    simulated = min(r["memory_overshoot_bytes"] for r in over)
    extra = closest_misses(space, over)
    assert simulated > least  # the closest miss was among the skipped variants: the check cannot pass empty
    assert min(r["memory_overshoot_bytes"] for r in over + extra) == least
    assert len(extra) < result.n_dominated  # a few, not every skipped layout
    # the one rule search and plan name their closest miss by
    from echo_tune.search.space.dominance import closest_miss
    assert closest_miss(space, over)["memory_overshoot_bytes"] == least and closest_miss(space, []) is None


def test_the_known_variants_are_found_without_keying_every_record(small_space):
    """``_known_variants`` keys only the records that share a head's GPUs, TP, PP, micro-batch and
    interleaving, and among them every recompute variant of a head."""
    from echo_tune.search.space.dominance import _known_variants

    valid, _ = check_space(small_space)
    head = next(m for m in ordered_groups(valid) if len(m) == 3 and m[0].parallel.recompute_granularity is None)
    tp = head[0].parallel.tensor_model_parallel_size
    other = next(c for c in valid if c.parallel.tensor_model_parallel_size != tp)
    records = [{"config": c.config} for c in [*head, other]]
    known = _known_variants(records, records[:1])
    assert known == {c.key for c in head}
