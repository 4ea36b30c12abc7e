"""benchmarks/stored_study.py and search_replay.py: a kept exhaustive study read from its journal, the default
search's rounds replayed on it."""

from pathlib import Path

import pytest
import search_replay
from stored_study import exhaustive_journal, read_study

from echo_tune.search import SearchOptions, load_space, run_search
from echo_tune.search.space.dominance import config_group_key
from echo_tune.search.space.layouts import config_key
from echo_tune.search.space.space_check import check_space

MIXTRAL = Path(__file__).resolve().parents[2] / "search_spaces" / "mixtral-8x7b-64xh100.yaml"


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    space = load_space(MIXTRAL)
    results = tmp_path_factory.mktemp("kept")
    result = run_search(space, SearchOptions(sampler="exhaustive", study_name=f"{space.name}-exhaustive-1",
                                             results_dir=results, write_files=False))
    return space, result, read_study(exhaustive_journal(results, space.name), truth=True)


def test_the_journal_read_line_by_line_gives_the_search_summary(kept):
    space, result, stored = kept
    assert stored.layouts == result.n_trials == 456
    assert stored.simulated == result.n_simulated < 456  # dominated layouts are stored, not simulated
    assert stored.optimum_s == pytest.approx(result.best["step_time_s"], rel=1e-12)
    valid, _ = check_space(space)
    assert {hash(c.key) for c in valid} == set(stored.truth)


def test_dominated_layouts_get_their_twins_time_and_the_replay_reaches_the_optimum(kept):
    space, result, stored = kept
    simulated = {hash(config_key(r["config"])) for r in result.records}
    fitting_twins = {config_group_key(r["config"]): r["step_time_s"] for r in result.records
                     if r["fits_memory"] and r["config"]["recompute_granularity"] is None}
    valid, _ = check_space(space)
    dominated = [c for c in valid if hash(c.key) not in simulated and stored.truth[hash(c.key)] is not None]
    assert dominated
    for c in dominated:  # its twin without recompute fits: the twin's time, a lower bound of its own
        assert c.parallel.recompute_granularity is not None
        assert stored.truth[hash(c.key)] == fitting_twins[config_group_key(c._config)]
    best, known = search_replay.replay(space, valid, stored.truth, 350)
    assert len(known) == 350 and best == stored.optimum_s  # the budget of tests/search/test_auto_sampler.py
