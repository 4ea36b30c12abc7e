"""Exhaustive search in batches: the same study whatever the number of processes."""

from __future__ import annotations

from echo_tune.search import SearchOptions, check_space, run_search
from echo_tune.search.exhaustive import batches


def test_batches_cover_every_layout_once_costliest_first(small_space):
    valid, _ = check_space(small_space)
    parts = batches(valid, 2)
    flat = [c.key for b in parts for c in b]
    assert len(flat) == len(set(flat)) == len(valid) and set(flat) == {c.key for c in valid}
    assert len(parts) >= 2 * 2  # several per process, so they even out

    def cost(c):
        return c.layout.virtual_pipeline_size * len(c.layout.stage_chunk_layers)
    assert cost(parts[0][0]) >= cost(parts[-1][-1])


def test_two_processes_store_the_same_study_as_one(small_space, tmp_path):
    one = run_search(small_space, SearchOptions(sampler="exhaustive", n_jobs=1, results_dir=tmp_path / "one"))
    two = run_search(small_space, SearchOptions(sampler="exhaustive", n_jobs=2, results_dir=tmp_path / "two"))
    assert one.n_trials == two.n_trials == len(check_space(small_space)[0])
    name = small_space.name
    assert (tmp_path / "one" / name / "trials.csv").read_text() == (tmp_path / "two" / name / "trials.csv").read_text()
    assert one.best == two.best
