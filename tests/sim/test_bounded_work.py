"""Bounded work (issue 10): simulating a huge global batch costs what a small one costs (the schedule is
extrapolated from its period, never built whole); a recorded timeline and a huge search space are
refused with one line instead of exhausting memory or running silently for minutes."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from echo_tune.config.load.loading import load_cluster, load_model
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.errors import ConfigError
from echo_tune.limits import MAX_SIMULATED_MICRO_BATCHES
from echo_tune.search.space import space_check as space_check_module
from echo_tune.search import check_space, load_space
from echo_tune.sim.simulate import simulate

MODEL = load_model("gpt-1.7b")
CLUSTER = load_cluster("a100-80gb")


def _peak_bytes(fn) -> tuple[float, int]:
    tracemalloc.start()
    started = time.perf_counter()
    try:
        fn()
    finally:
        seconds = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return seconds, peak


@pytest.mark.parametrize("layout", [
    {},  # PP1: the "none" schedule
    {"pipeline_model_parallel_size": 4},  # 1F1B
    {"pipeline_model_parallel_size": 4, "virtual_pipeline_model_parallel_size": 2},  # interleaved
])
def test_huge_global_batch_costs_what_a_small_one_costs(layout):
    def run(gbs: int):
        return lambda: simulate(MODEL, CLUSTER, 8, ParallelConfig(global_batch_size=gbs, **layout))
    run(64)()  # warm the caches of both
    small_s, small_peak = _peak_bytes(run(64))
    huge_s, huge_peak = _peak_bytes(run(2**20))  # 2**31 tokens per step, the most a step may hold
    assert huge_peak < 4 * small_peak + (8 << 20), (small_peak, huge_peak)
    assert huge_s < 20 * small_s + 1.0, (small_s, huge_s)
    report = simulate(MODEL, CLUSTER, 8, ParallelConfig(global_batch_size=2**20, **layout))
    small = simulate(MODEL, CLUSTER, 8, ParallelConfig(global_batch_size=64, **layout))
    assert report.step_time_s > 1e4 * small.step_time_s  # 2**14 times the batch: ~2**14 times the time


def test_timeline_of_too_many_micro_batches_is_refused():
    gbs = 8 * (MAX_SIMULATED_MICRO_BATCHES + 1)
    with pytest.raises(ConfigError, match="to record a timeline"):
        simulate(MODEL, CLUSTER, 8, ParallelConfig(global_batch_size=gbs), timeline=True)


def test_huge_space_is_refused_not_enumerated_silently(monkeypatch):
    space = load_space(Path(__file__).resolve().parents[2] / "search_spaces" / "small-gpt7b-16xa100.yaml")
    valid, _ = check_space(space)
    monkeypatch.setattr(space_check_module, "MAX_VALID_LAYOUTS", len(valid) - 1)
    with pytest.raises(ConfigError, match=f"more than {len(valid) - 1} valid layouts"):
        check_space(space)
