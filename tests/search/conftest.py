"""The small example's searches, run once per session (the 200-trial TPE check is in tests/cli)."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_tune.search import SearchOptions, load_space, run_search

REPO = Path(__file__).resolve().parents[2]
SPACES = REPO / "search_spaces"
SMALL = SPACES / "small-gpt7b-16xa100.yaml"


@pytest.fixture(scope="session")
def small_space():
    return load_space(SMALL)


@pytest.fixture(scope="session")
def results_root(tmp_path_factory):
    return tmp_path_factory.mktemp("results")


@pytest.fixture(scope="session")
def small_exhaustive(small_space, results_root):
    return run_search(small_space, SearchOptions(sampler="exhaustive", results_dir=results_root,
                                                 study_name="exhaustive"))


@pytest.fixture(scope="session")
def small_tpe(small_space, results_root):
    return run_search(small_space, SearchOptions(sampler="tpe", n_trials=60, seed=0, results_dir=results_root,
                                                 study_name="tpe"))
