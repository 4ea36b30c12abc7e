"""The default search ("auto", search/engines/auto.py) on the Mixtral 8x7B / 64 H100 space (456 layouts, 76 structures).

Its budget is cut below the space's size (350 layouts: every structure at up to 4 layouts, then the best
structures whole), so the structure-first rounds run rather than the small-space exhaustive fallback.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_tune.cli.main import main
from echo_tune.plan.planner import PlanOptions
from echo_tune.search import SearchOptions, load_space, run_search
from echo_tune.search.engines.auto import _light, _typical, groups, next_round, representatives
from echo_tune.search.space.layouts import RejectedLayout, enumerate_layouts
from echo_tune.search.engines.objective import evaluate

MIXTRAL = Path(__file__).resolve().parents[2] / "search_spaces" / "mixtral-8x7b-64xh100.yaml"
BUDGET = 350


@pytest.fixture(scope="module")
def mixtral():
    return load_space(MIXTRAL)


@pytest.fixture(scope="module")
def optimum(mixtral):
    """The exhaustive optimum: every valid layout simulated, outside the study machinery."""
    best = None
    for c in enumerate_layouts(mixtral):
        try:
            record = evaluate(mixtral, c)[0]
        except RejectedLayout:
            continue
        if record["fits_memory"] and (best is None or record["step_time_s"] < best):
            best = record["step_time_s"]
    return best


def _keys(result_dir: Path, name: str) -> set:
    import optuna

    from echo_tune.search.storage.study_storage import open_storage

    study = optuna.load_study(study_name=name, storage=open_storage(result_dir / name, None).storage)
    # by the layout stored (a dominated trial has no params: search/space/dominance.py)
    return {tuple(sorted((t.user_attrs.get("record") or t.user_attrs)["config"].items()))
            for t in study.get_trials(deepcopy=False)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_search_finds_the_exhaustive_optimum(mixtral, optimum, seed, tmp_path):
    result = run_search(mixtral, SearchOptions(n_trials=BUDGET, seed=seed, results_dir=tmp_path, write_files=False))
    assert result.sampler == "auto"
    assert result.n_trials == BUDGET and result.space_size == 456
    assert result.coverage == pytest.approx(BUDGET / 456)
    assert result.best["step_time_s"] == pytest.approx(optimum, rel=1e-9)


def test_every_structure_is_tried_and_rounds_are_deterministic(mixtral):
    valid = list(enumerate_layouts(mixtral))
    first = next_round(valid, {}, BUDGET)
    assert len(first) == sum(len(representatives(m)) for m in groups(valid).values())
    assert {tuple(c.key for c in first)} == {tuple(c.key for c in next_round(valid, {}, BUDGET))}
    assert [c.key for c in next_round(valid, {}, 10_000)] == [c.key for c in valid]  # small space: every layout


def test_interrupted_default_search_resumes_to_the_same_layouts(mixtral, tmp_path):
    whole = tmp_path / "whole"
    run_search(mixtral, SearchOptions(n_trials=BUDGET, results_dir=whole, write_files=False))
    parts = tmp_path / "parts"
    run_search(mixtral, SearchOptions(n_trials=120, results_dir=parts, write_files=False))
    again = run_search(mixtral, SearchOptions(n_trials=BUDGET, results_dir=parts, resume=True, write_files=False))
    assert again.n_trials == BUDGET and again.new_trials == BUDGET - 120
    assert _keys(parts, mixtral.name) == _keys(whole, mixtral.name)


def test_default_is_auto_for_search_and_plan_and_output_states_coverage(tmp_path, capsys):
    assert SearchOptions().sampler == "auto" and PlanOptions(tokens=1.0).sampler == "auto"
    assert PlanOptions(tokens=1.0).n_trials is None
    assert main(["search", str(MIXTRAL), "--n-trials", "30", "--results-dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sampler"] == "auto" and data["coverage"] == pytest.approx(30 / 456)
    assert main(["search", str(MIXTRAL), "--n-trials", "30", "--results-dir", str(tmp_path / "t")]) == 0
    out = " ".join(capsys.readouterr().out.split())  # as one line, however the console wraps it
    assert "coverage: 30 of the 456 valid layouts in the space covered (6.6%)" in out  # some over memory, untimed
    assert "of them by more than the memory model's error: step not simulated)" in out


@pytest.fixture(scope="module")
def truth(mixtral):
    """Every layout's first objective (None: over memory or rejected), as stored_scores gives them."""
    out = {}
    for c in enumerate_layouts(mixtral):
        try:
            record = evaluate(mixtral, c)[0]
        except RejectedLayout:
            out[c.key] = None
            continue
        out[c.key] = record["step_time_s"] if record["fits_memory"] else None
    return out


def test_too_many_structures_for_every_representative(mixtral, truth):
    """76 structures x 4 representatives > a budget of 200: each structure's typical layout first, then the
    fastest where the typical one fits and the lightest where it does not, then the other representatives of the
    best structures, then the best structures whole; every round from the stored scores only."""
    valid = list(enumerate_layouts(mixtral))
    by_structure = groups(valid)
    budget = 200
    assert len(by_structure) * 4 > budget
    scores: dict = {}
    rounds = []
    while todo := next_round(valid, scores, budget):
        rounds.append(todo)
        scores.update({c.key: truth[c.key] for c in todo})
    typical = {s: min(m, key=_typical) for s, m in by_structure.items()}
    assert {c.key for c in rounds[0]} == {c.key for c in typical.values()}
    fits = [s for s in by_structure if truth[typical[s].key] is not None]
    assert fits and all(representatives(by_structure[s])[0].key in scores for s in fits)
    # where the typical layout does not fit, the lightest (full recompute) shows whether the structure can
    over = [s for s in by_structure if truth[typical[s].key] is None]
    assert over and all(min(by_structure[s], key=_light).key in scores for s in over)
    assert len(scores) == budget and len(rounds) >= 3  # the last round fills the budget
    whole = [s for s, m in by_structure.items() if all(c.key in scores for c in m)]
    assert whole  # the last round simulates the best structures completely
    assert min(v for v in scores.values() if v is not None) == min(v for v in truth.values() if v is not None)
