"""Exhaustive search in batches: the same study whatever the number of processes."""

from __future__ import annotations

from echo_tune.search import SearchOptions, check_space, run_search
from echo_tune.search.engines.exhaustive import batches


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


def test_pieces_the_trace_cache_holds_go_to_workers_by_reference(small_space, tmp_path, monkeypatch):
    """A worker is sent None for pieces on disk and loads them itself: the same trials as with the pieces sent.
    With the trace cache off, the pieces travel with the batch."""
    from echo_tune.search.engines.exhaustive import _evaluate_batch, _pieces_for
    from echo_tune.sim.schedule import passes

    monkeypatch.setenv("ECHO_TUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(passes, "_PIECES", {})  # nothing traced in this process yet: traced and saved below
    batch = check_space(small_space)[0][:8]
    sent = _pieces_for(small_space, batch, by_reference=True)
    assert sent and all(pieces is None for pieces in sent.values())
    here = _evaluate_batch(small_space, batch, None, _pieces_for(small_space, batch))
    monkeypatch.setattr(passes, "_PIECES", {})  # as in a worker that has seen none of them
    there = _evaluate_batch(small_space, batch, None, sent)
    assert [t.values for t in there] == [t.values for t in here] and len(here) == 8
    monkeypatch.setenv("ECHO_TUNE_TRACE_CACHE", "0")
    assert all(pieces is not None for pieces in _pieces_for(small_space, batch, by_reference=True).values())
