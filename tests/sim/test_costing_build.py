"""The exhaustive search's shortcuts in the simulator (issue 38) give what the plain code gives, bit for bit:
PhaseCost built without its __init__, the remembered pipeline runs, memory peaks and DP tails, the pass costs
cached in two parts, and the DP tail's summed last buckets."""

from __future__ import annotations

import dataclasses
import random

import pytest

from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.profile import profile_for
from echo_tune.config.load.loading import load_cluster
from echo_tune.sim.data_parallel import dp
from echo_tune.sim.schedule import engine, passes, schedules
from echo_tune.sim.schedule.costing import PhaseCost, _built

from .test_fast_engine import _random_case, _random_chunks


def test_a_built_phase_cost_is_the_constructed_one():
    names = [f.name for f in dataclasses.fields(PhaseCost)]  # a new field must be added to _built too
    assert names == list(_built.__code__.co_varnames[:len(names)])
    rng = random.Random(0)
    for _ in range(200):
        values = [rng.choice([0.0, -0.0, rng.uniform(-1, 1), 1e-300]) for _ in names]
        built, made = _built(*values), PhaseCost(**dict(zip(names, values)))
        assert built == made and hash(built) == hash(made) and type(built) is PhaseCost
        assert dataclasses.astuple(built) == dataclasses.astuple(made)
        with pytest.raises(dataclasses.FrozenInstanceError):
            built.compute_s = 1.0


def test_a_remembered_pipeline_run_is_the_simulated_one():
    rng = random.Random(3)
    for _ in range(80):
        schedule, p, m, v, fwd, bwd, p2p = _random_case(rng)
        engine._RESULTS.clear()
        fresh = engine._simulate_pipeline(schedule, p, m, v, fwd, bwd, p2p, None)
        first = engine.simulate_pipeline(schedule, p, m, v, fwd, bwd, p2p)
        again = engine.simulate_pipeline(schedule, p, m, v, [list(r) for r in fwd], [list(r) for r in bwd], p2p)
        assert first == fresh and again is first
        if p > 1:  # one duration changed: not the remembered run
            bwd[0][0] += 1e-6
            assert engine.simulate_pipeline(schedule, p, m, v, fwd, bwd, p2p) == \
                engine._simulate_pipeline(schedule, p, m, v, fwd, bwd, p2p, None)


def test_a_remembered_memory_peak_is_the_summed_one():
    rng = random.Random(4)
    for _ in range(300):
        schedule = rng.choice(["1f1b", "interleaved", "gpipe"])
        p, v = rng.choice([2, 4, 8]), (rng.choice([2, 3]) if schedule == "interleaved" else 1)
        m, stage = p * rng.randint(1, 6), rng.randrange(p)
        chunk_bytes = [float(rng.choice([0, rng.randint(1, 10**10)])) for _ in range(v)]
        expected = schedules._peak_in_flight(schedule, stage, p, m, v, chunk_bytes, None)
        assert schedules.peak_in_flight_bytes(schedule, stage, p, m, v, chunk_bytes) == expected
        assert schedules.peak_in_flight_bytes(schedule, stage, p, m, v, list(chunk_bytes)) == expected


@pytest.mark.parametrize("overlap", [True, False])
def test_the_dp_tail_with_experts_is_the_bucket_loops(overlap):
    """The summed tail (every bucket ready, the compute over) and the remembered tail give the bucket loop's
    floats exactly (with ``spans`` the loop runs bucket by bucket)."""
    profile = profile_for(load_cluster("h100"))
    rng = random.Random(5)
    for _ in range(200):
        parallel = ParallelConfig(global_batch_size=1024, use_distributed_optimizer=True, overlap_grad_reduce=overlap,
                                  overlap_param_gather=overlap)
        size = rng.choice([8, 64])
        group = GroupPlacement(size=size, ranks_per_node=8, num_nodes=size // 8)
        edp = GroupPlacement(size=max(1, size // 8), ranks_per_node=min(8, max(1, size // 8)),
                             num_nodes=max(1, size // 64))
        v = rng.choice([1, 2, 4])
        chunks, t = _random_chunks(rng, v)
        experts = [rng.choice([10**6, 4 * 10**7, rng.randint(10**8, 4 * 10**9)]) for _ in range(v)]
        params = [e + rng.randint(10**6, 10**9) for e in experts]
        end = t + rng.choice([0.0, rng.uniform(0.0, 0.5)])
        args = dict(parallel=parallel, dp=group, profile=profile, chunk_params=params, chunk_backward=chunks,
                    compute_end_s=end, expert_chunk_params=experts, edp=edp)
        dp._TAILS._entries.clear()
        looped = dp.stage_tail(**args, spans=[])
        assert dp.stage_tail(**args) == looped  # the summed tail, then remembered
        assert dp.stage_tail(**args) == looped


def test_pass_costs_in_two_parts_are_the_whole(monkeypatch):
    """Costs of one pass for two recompute module sets, the passes shared: each equals the costs computed
    with nothing cached."""
    from echo_tune.search.space.auto_space import auto_space
    from echo_tune.search.space.space_check import check_space
    from echo_tune.sim.step_setup import cost_context
    from echo_tune.sim.schedule.memo import profile_for_cluster

    space = auto_space(model="mixtral-8x7b", cluster="h100", num_gpus=16, global_batch_size=64,
                       layout={"overlap_moe_expert_parallel_comm": True, "recompute_granularity": "selective"})
    seen: dict[tuple, object] = {}
    for c in check_space(space)[0][:400]:
        pieces = passes.trace_pieces(c.model, c.parallel, c.layout)
        ctx = cost_context(c.model, space.cluster, c.parallel, c.layout, profile_for_cluster(space.cluster))
        regions = c.layout.recompute_regions
        cached = passes.pass_costs(pieces, ctx, regions)
        passes._COSTS._entries.clear()
        assert cached == passes.pass_costs(pieces, ctx, regions)
        seen[regions] = cached
    assert len(seen) > 1  # several module sets met
