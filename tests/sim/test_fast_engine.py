"""The fast engine (compiled programs, closed forms, caches) against the engine it replaced.

``reference_engine.py`` is the old engine verbatim. Pipeline times must be bit-for-bit equal (same
floating-point operations); the DP tail's closed form may differ by rounding only (relative 1e-12);
whole reports over the example search spaces by at most 1e-9 relative.
"""

from __future__ import annotations

import contextlib
import os
import random
from pathlib import Path

import pytest

import echo_tune.sim.memory.stage as memory_module
import echo_tune.sim.simulate as simulate_module
from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.profile import profile_for
from echo_tune.config.load.loading import load_cluster
from echo_tune.search import check_space, load_space
from echo_tune.search.space.layouts import RejectedLayout
from echo_tune.search.engines.objective import evaluate
from echo_tune.sim.schedule import engine
from echo_tune.sim.data_parallel.dp import stage_tail
from echo_tune.sim.schedule.schedules import peak_in_flight_bytes

from . import reference_engine as ref

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"


def _random_chunks(rng: random.Random, v: int) -> tuple[list[tuple[float, float]], float]:
    """``v`` model chunks' (start, end) of their last backward, latest first, and the last end."""
    t, chunks = 0.0, []
    for _ in range(v):
        start = t + rng.uniform(0.0, 0.05)
        t = start + rng.uniform(0.001, 0.3)
        chunks.append((start, t))
    chunks.reverse()
    return chunks, t


def _random_case(rng: random.Random):
    schedule = rng.choice(["none", "gpipe", "1f1b", "1f1b", "interleaved", "interleaved"])
    p = 1 if schedule == "none" else rng.choice([1, 2, 3, 4, 8, 16])
    if schedule == "interleaved" and p == 1:
        schedule = "1f1b"
    v = rng.choice([2, 3, 4]) if schedule == "interleaved" else 1
    m = p * rng.randint(1, 12) if schedule == "interleaved" else rng.choice([1, 2, 3, p, 2 * p, 5 * p + 1, 64, 100])
    fwd = [[rng.uniform(0.1, 2.0) for _ in range(v)] for _ in range(p)]
    bwd = [[rng.uniform(0.1, 4.0) for _ in range(v)] for _ in range(p)]
    return schedule, p, max(m, 1), v, fwd, bwd, rng.choice([0.0, rng.uniform(0.0, 0.5)])


@pytest.mark.parametrize("seed", range(4))
def test_pipeline_times_are_bit_for_bit_the_old_engines(seed):
    rng = random.Random(seed)
    for _ in range(60):
        schedule, p, m, v, fwd, bwd, p2p = _random_case(rng)
        old, new = ref.simulate_pipeline(schedule, p, m, v, fwd, bwd, p2p), \
            engine.simulate_pipeline(schedule, p, m, v, fwd, bwd, p2p)
        assert (new.end_s, new.critical_p2p_s, new.last_backward_end_s) == \
            (old.end_s, old.critical_p2p_s, old.last_backward_end_s), (schedule, p, m, v)
        old, new = ref.run_pipeline(schedule, p, m, v, fwd, bwd, p2p, record=True), \
            engine.run_pipeline(schedule, p, m, v, fwd, bwd, p2p, record=True)
        assert new.events == old.events and new.end_s == old.end_s and new.critical_p2p_s == old.critical_p2p_s


def test_periodic_runs_share_tasks():
    """The three periodic runs cost less than three separate runs (the shorter ones reuse tasks)."""
    whole = sum(len(engine._program("interleaved", 8, 2, (m,)).prev) for m in (16, 24, 32))
    shared = len(engine._program("interleaved", 8, 2, (32, 24, 16)).prev)
    assert shared < 0.6 * whole


def test_memory_peak_matches_the_task_by_task_sum():
    rng = random.Random(0)
    for schedule in ("none", "gpipe", "1f1b", "interleaved"):
        for p in (1, 2, 3, 8):
            for v in ((2, 3) if schedule == "interleaved" else (1,)):
                for m in (1, 2, p, 2 * p, 4 * p + 3, 9 * p + 1, 100):
                    if schedule == "interleaved" and (p == 1 or m % p):
                        continue
                    for s in range(p):
                        chunk_bytes = [float(rng.randint(0, 10**10)) for _ in range(v)]
                        order = ref.stage_order(schedule, s, p, m, v)
                        if schedule in ("1f1b", "interleaved"):
                            order = order[:4 * p * v + 2]
                        assert peak_in_flight_bytes(schedule, s, p, m, v, chunk_bytes) == \
                            ref.peak_in_flight_total(order, chunk_bytes)


@pytest.mark.parametrize("distributed, overlap", [(True, True), (False, True), (True, False)])
def test_dp_tail_closed_form_matches_bucket_by_bucket(distributed, overlap):
    profile = profile_for(load_cluster("a100-80gb"))
    rng = random.Random(1)
    for _ in range(300):
        parallel = ParallelConfig(global_batch_size=1536, use_distributed_optimizer=distributed,
                                  overlap_grad_reduce=overlap, overlap_param_gather=distributed and overlap)
        size = rng.choice([2, 8, 64, 512])
        per_node = min(size, 8)
        dp = GroupPlacement(size=size, ranks_per_node=per_node, num_nodes=size // per_node)
        v = rng.choice([1, 1, 2, 3])
        t, chunks = 0.0, []
        for _ in range(v):  # backward of the last micro-batch: chunk v-1 first, then down to 0
            start = t + rng.uniform(0.0, 0.05)
            t = start + rng.uniform(0.001, 0.3)
            chunks.append((start, t))
        chunks.reverse()
        params = [rng.choice([1, 10**6, 4 * 10**7, rng.randint(10**6, 6 * 10**9)]) for _ in range(v)]
        end = t + rng.choice([0.0, rng.uniform(0.0, 0.5)])
        args = dict(parallel=parallel, dp=dp, profile=profile, chunk_params=params, chunk_backward=chunks,
                    compute_end_s=end, embedding_sync_s=rng.choice([0.0, 0.01]))
        old, new = ref.stage_tail(**args), stage_tail(**args)
        for name in ("dp_exposed_s", "interference_s", "optimizer_s"):
            assert getattr(new, name) == pytest.approx(getattr(old, name), rel=1e-12, abs=1e-15), name


@pytest.mark.parametrize("distributed, overlap", [(True, True), (False, True), (True, False)])
def test_dp_tail_with_experts_matches_the_reference(distributed, overlap):
    """The expert path (dense and expert buckets on one stream, each size costed once) gives the reference's
    bucket-by-bucket tail: same order, same durations."""
    profile = profile_for(load_cluster("h100"))
    rng = random.Random(2)
    for _ in range(200):
        parallel = ParallelConfig(global_batch_size=1024, use_distributed_optimizer=distributed,
                                  overlap_grad_reduce=overlap, overlap_param_gather=distributed and overlap)
        size = rng.choice([2, 8, 64])
        per_node = min(size, 8)
        dp = GroupPlacement(size=size, ranks_per_node=per_node, num_nodes=size // per_node)
        edp_size = max(1, size // rng.choice([1, 2, 8]))
        edp = GroupPlacement(size=edp_size, ranks_per_node=min(edp_size, 8), num_nodes=-(-edp_size // 8))
        v = rng.choice([1, 2, 4])
        chunks, t = _random_chunks(rng, v)
        experts = [rng.choice([0, 10**6, 4 * 10**7, rng.randint(10**6, 4 * 10**9)]) for _ in range(v)]
        params = [e + rng.choice([1, 10**6, rng.randint(10**6, 10**9)]) for e in experts]
        end = t + rng.choice([0.0, rng.uniform(0.0, 0.5)])
        args = dict(parallel=parallel, dp=dp, profile=profile, chunk_params=params, chunk_backward=chunks,
                    compute_end_s=end, expert_chunk_params=experts, edp=edp)
        old, new = ref.stage_tail(**args), stage_tail(**args)
        for name in ("dp_exposed_s", "interference_s", "optimizer_s"):
            assert getattr(new, name) == pytest.approx(getattr(old, name), rel=1e-12, abs=1e-15), name


def _old_peak(schedule, stage, p, m, v, chunk_bytes):
    order = ref.stage_order(schedule, stage, p, m, v)
    if schedule in ("1f1b", "interleaved"):
        order = order[:4 * p * v + 2]
    return ref.peak_in_flight_total(order, chunk_bytes)


@contextlib.contextmanager
def _old_engine():
    names = (simulate_module, "simulate_pipeline", ref.simulate_pipeline), \
        (simulate_module, "run_pipeline", ref.run_pipeline), (simulate_module, "stage_tail", ref.stage_tail), \
        (memory_module, "peak_in_flight_bytes", _old_peak)
    saved = [(module, name, getattr(module, name)) for module, name, _ in names]
    for module, name, old in names:
        setattr(module, name, old)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def _record(space, candidate):
    try:
        return evaluate(space, candidate)[0]
    except RejectedLayout as exc:
        return exc.rule


def _assert_close(old, new):
    if isinstance(old, str) or isinstance(new, str):
        assert old == new
        return
    for key, value in old.items():
        if key == "breakdown_s":
            for part, seconds in value.items():
                assert new[key][part] == pytest.approx(seconds, rel=1e-9, abs=1e-9 * old["step_time_s"]), part
        elif isinstance(value, float):
            assert new[key] == pytest.approx(value, rel=1e-9), key
        else:
            assert new[key] == value, key


# Every layout of the small spaces; every 15th of the large ones (all of them with ECHO_TUNE_FULL_EXACTNESS=1,
# several minutes: the old engine is slow).
EVERY = {"small-gpt7b-16xa100": 1, "small-gpt7b-cost": 1, "gpt3-175b-1024xa100": 15, "gpt3-175b-96xh800": 15,
         "llama3-70b-64xh100": 15}


@pytest.mark.parametrize("name", sorted(EVERY))
def test_example_spaces_give_the_old_engines_results(name):
    space = load_space(SPACES / f"{name}.yaml")
    valid, _ = check_space(space)
    step = 1 if os.environ.get("ECHO_TUNE_FULL_EXACTNESS") == "1" else EVERY[name]
    sample = valid[::step]
    new = [_record(space, c) for c in sample]
    with _old_engine():
        old = [_record(space, c) for c in sample]
    for a, b in zip(old, new):
        _assert_close(a, b)
