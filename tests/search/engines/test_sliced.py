"""Exhaustive search with the enumeration shared out (sliced.py): the same layouts, in the same order, the same
study and summary as the route that enumerates first, and the cases that must take that route."""

from __future__ import annotations

import gc

import pytest

from echo_tune.errors import ConfigError
from echo_tune.search import SearchOptions, check_space, load_space, run_search
from echo_tune.search import study as study_module
from echo_tune.search.engines import gc_pause
from echo_tune.search.engines import sliced
from echo_tune.search.space.auto_space import auto_space
from echo_tune.search.engines.exhaustive import batches
from echo_tune.search.space.layouts import completions, enumerate_layouts, shape_prefixes

from tests.search.conftest import SMALL


@pytest.fixture(scope="module")
def moe_space():
    # the recipe features narrowed, to keep the tests short (with them all, 94,710 layouts: still sliced, the
    # product of the later settings' values past MAX_VALID_LAYOUTS but not the count, sliced.option_leaves)
    return auto_space(model="mixtral-8x7b", cluster="h100", num_gpus=16, global_batch_size=64,
                      layout={"recompute_modules": "none", "moe_flex_dispatcher_backend": "deepep",
                              "delay_wgrad_compute": True})


@pytest.mark.parametrize("name", ["small", "moe"])
def test_shapes_and_their_completions_are_the_enumeration(name, small_space, moe_space):
    space = small_space if name == "small" else moe_space
    whole = [c.key for c in enumerate_layouts(space)]
    cut = [c.key for p in shape_prefixes(space) for c in completions(space, p)]
    assert cut == whole and len(whole) > 700


@pytest.mark.parametrize("name", ["small", "moe"])
def test_tasks_run_the_layouts_in_the_order_batches_store_them(name, small_space, moe_space, monkeypatch):
    """What makes the study independent of the route: run_task's layouts, task after task, are batches()'
    order over check_space's list (nothing simulated here: the order is what is compared)."""
    space = small_space if name == "small" else moe_space
    seen: list[tuple] = []
    monkeypatch.setattr(sliced, "_evaluate_batch", lambda s, todo, *a: seen.extend(c.key for c in todo) or [])
    shapes = sliced.shapes_to_slice(space, n_jobs=2, every_layout=True, shared=False)
    for part in sliced.tasks(space, shapes, 2):
        sliced.run_task(space, None, part)
    expected = [c.key for b in batches(check_space(space)[0], 2) for c in b]
    assert seen == expected


def test_which_searches_are_sliced(small_space, monkeypatch):
    assert sliced.shapes_to_slice(small_space, n_jobs=2, every_layout=True, shared=False)
    for kwargs in ({"n_jobs": 1, "every_layout": True, "shared": False},  # nothing to share
                   {"n_jobs": 2, "every_layout": False, "shared": False},  # --n-trials or --timeout
                   {"n_jobs": 2, "every_layout": True, "shared": True}):  # a database: workers elsewhere
        assert sliced.shapes_to_slice(small_space, **kwargs) is None
    # more layouts possible than the bound: check_space counts them (and refuses past it)
    monkeypatch.setattr(sliced, "MAX_VALID_LAYOUTS", 500)
    assert sliced.shapes_to_slice(small_space, n_jobs=2, every_layout=True, shared=False) is None


def test_a_space_without_valid_layouts_is_refused_as_before(tmp_path):
    text = SMALL.read_text().replace("micro_batch_size: [1, 2, 4, 8]", "micro_batch_size: [512]")
    (tmp_path / "s.yaml").write_text(text)
    space = load_space(tmp_path / "s.yaml")
    assert sliced.shapes_to_slice(space, n_jobs=2, every_layout=True, shared=False) is None
    with pytest.raises(ConfigError, match="holds no valid layout"):
        run_search(space, SearchOptions(sampler="exhaustive", n_jobs=2, results_dir=tmp_path))


def test_two_processes_report_the_space_as_check_space_does(tmp_path, monkeypatch):
    """Size and notes (a value no valid layout takes: PP 5 does not divide 16 GPUs) from the tasks' tallies;
    the run went through run_sliced."""
    text = SMALL.read_text().replace("pipeline_model_parallel_size: auto", "pipeline_model_parallel_size: [1, 2, 5]")
    (tmp_path / "s.yaml").write_text(text)
    space = load_space(tmp_path / "s.yaml")
    valid, notes = check_space(space)
    assert notes and any("pipeline_model_parallel_size" in n for n in notes)
    calls = []
    real = sliced.run_sliced
    monkeypatch.setattr(sliced, "run_sliced", lambda *a, **k: calls.append(1) or real(*a, **k))
    two = run_search(space, SearchOptions(sampler="exhaustive", n_jobs=2, results_dir=tmp_path / "two",
                                          write_files=False))
    one = run_search(space, SearchOptions(sampler="exhaustive", n_jobs=1, results_dir=tmp_path / "one",
                                          write_files=False))
    assert calls == [1]
    assert two.space_size == one.space_size == len(valid) == two.n_trials
    assert [n for n in two.notes if "appear in no valid layout" in n] == notes
    assert two.best == one.best and two.records == one.records


def test_an_interrupted_sliced_run_keeps_its_trials_counts_the_space_and_resumes(small_space, tmp_path):
    valid, _ = check_space(small_space)
    seen = []

    def stop_after_first(done, total, record):
        seen.append((done, total))
        raise KeyboardInterrupt
    opts = dict(sampler="exhaustive", n_jobs=2, results_dir=tmp_path, write_files=False)
    first = run_search(small_space, SearchOptions(**opts), progress=stop_after_first)
    assert first.interrupted and seen[0][1] is None  # no total before the tasks have enumerated the space
    assert 0 < first.n_trials < len(valid) and first.space_size == len(valid)
    rest = run_search(small_space, SearchOptions(resume=True, **opts))
    assert rest.n_trials == len(valid) and rest.new_trials == len(valid) - first.n_trials


def test_a_worker_pauses_the_collector_per_task_and_thaws_a_new_run(monkeypatch):
    was = gc.isenabled()
    monkeypatch.setitem(gc_pause._WORKER, "in_worker", True)
    monkeypatch.setitem(gc_pause._WORKER, "run", None)
    try:
        gc.enable()
        gc_pause.task_begins("run 1")
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        gc_pause.task_ends()
        assert gc.isenabled() and gc.get_freeze_count() > 0  # on, scanning only what is not frozen
        gc_pause.task_begins("run 2")  # a new run: the last one's frozen objects collected first, then frozen anew
        assert gc_pause._WORKER["run"] == "run 2"
        gc_pause.task_ends()
        gc_pause.run_ends()
        assert gc.isenabled() and gc.get_freeze_count() == 0 and gc_pause._WORKER["run"] is None
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()
    monkeypatch.setitem(gc_pause._WORKER, "in_worker", False)  # in the parent: nothing happens
    gc_pause.task_begins("run 3")
    assert gc.isenabled() == was and gc.get_freeze_count() == 0


def _probe() -> tuple[int, bool]:
    import os
    import time

    time.sleep(0.2)  # long enough that every worker takes one
    return os.getpid(), gc.isenabled()


@pytest.mark.parametrize("how", ["three processes", "interrupted"])
def test_no_worker_is_left_with_the_collector_off(how, small_space, tmp_path):
    """A review found the workers that did not draw the plot (all but one with three processes) or whose run
    was cut short kept the collector off for the pool's next search."""
    from echo_tune.search.engines.workers import worker_pool

    n_jobs = 3 if how == "three processes" else 2

    def stop(done, total, record):
        raise KeyboardInterrupt
    result = run_search(small_space, SearchOptions(sampler="exhaustive", n_jobs=n_jobs, results_dir=tmp_path,
                                                   write_files=False), progress=stop if how == "interrupted" else None)
    assert result.interrupted == (how == "interrupted")
    pool = worker_pool(n_jobs)
    states = {f.result() for f in [pool.submit(_probe) for _ in range(4 * (n_jobs - 1))]}
    assert len({pid for pid, _ in states}) == n_jobs - 1 and all(on for _, on in states), states


def test_study_module_routes_only_exhaustive_searches(small_space):
    for sampler in ("auto", "tpe", "random"):
        assert study_module._shapes_to_slice(small_space, SearchOptions(sampler=sampler, n_jobs=2)) is None
    assert study_module._shapes_to_slice(small_space, SearchOptions(sampler="exhaustive", n_jobs=2))
    assert study_module._shapes_to_slice(small_space, SearchOptions(sampler="exhaustive", n_jobs=2, timeout=60)) is None
