"""Pipeline schedules in a compute-only setting: bubbles match the closed forms."""

import random

import pytest

from echo_tune.sim.schedule.engine import run_pipeline, simulate_pipeline
from echo_tune.sim.schedule.schedules import peak_in_flight, stage_order


def uniform(p, v, f=1.0, b=2.0):
    return [[f / v] * v for _ in range(p)], [[b / v] * v for _ in range(p)]


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (8, 8), (8, 64), (16, 48)])
def test_1f1b_bubble_fraction(p, m):
    fwd, bwd = uniform(p, 1)
    step = max(run_pipeline("1f1b", p, m, 1, fwd, bwd, 0.0).end_s)
    busy = m * 3.0
    assert (step - busy) / step == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)


@pytest.mark.parametrize("p, m, v", [(4, 8, 2), (4, 16, 4), (8, 16, 3), (16, 64, 2)])
def test_interleaving_shrinks_bubble_by_v(p, m, v):
    fwd, bwd = uniform(p, v)
    step = max(run_pipeline("interleaved", p, m, v, fwd, bwd, 0.0).end_s)
    bubble = step - 3.0 * m
    assert bubble == pytest.approx((p - 1) * 3.0 / v, rel=1e-9)
    f1, b1 = uniform(p, 1)
    assert step < max(run_pipeline("1f1b", p, m, 1, f1, b1, 0.0).end_s)


def test_gpipe_matches_1f1b_time_but_holds_all_micro_batches():
    fwd, bwd = uniform(4, 1)
    assert max(run_pipeline("gpipe", 4, 8, 1, fwd, bwd, 0.0).end_s) == \
        pytest.approx(max(run_pipeline("1f1b", 4, 8, 1, fwd, bwd, 0.0).end_s))
    assert peak_in_flight(stage_order("gpipe", 0, 4, 8), 1) == [8]
    assert peak_in_flight(stage_order("1f1b", 0, 4, 8), 1) == [4]
    assert peak_in_flight(stage_order("1f1b", 3, 4, 8), 1) == [1]


def test_more_micro_batches_never_raise_bubble_fraction():
    fwd, bwd = uniform(8, 1)
    fractions = []
    for m in (8, 16, 32, 64, 128):
        step = max(run_pipeline("1f1b", 8, m, 1, fwd, bwd, 0.05).end_s)
        fractions.append((step - 3.0 * m) / step)
    assert fractions == sorted(fractions, reverse=True)


@pytest.mark.parametrize("schedule, p, m, v", [("1f1b", 8, 100, 1), ("1f1b", 16, 192, 1),
                                               ("interleaved", 8, 96, 2), ("none", 1, 50, 1)])
def test_periodic_extrapolation_is_exact(schedule, p, m, v):
    rng = random.Random(0)
    fwd = [[rng.uniform(0.9, 1.1) / v for _ in range(v)] for _ in range(p)]
    fwd[0] = [x + 0.2 for x in fwd[0]]  # embedding on the first stage
    bwd = [[2 * x for x in row] for row in fwd]
    full = run_pipeline(schedule, p, m, v, fwd, bwd, 0.03)
    fast = simulate_pipeline(schedule, p, m, v, fwd, bwd, 0.03)
    assert fast.end_s == pytest.approx(full.end_s, rel=1e-9)
    assert fast.critical_p2p_s == pytest.approx(full.critical_p2p_s, rel=1e-9, abs=1e-12)
    for a, b in zip(fast.last_backward_end_s, full.last_backward_end_s):
        assert a == pytest.approx(b, rel=1e-9)


def test_p2p_latency_is_on_the_critical_path():
    fwd, bwd = uniform(4, 1)
    base = max(run_pipeline("1f1b", 4, 8, 1, fwd, bwd, 0.0).end_s)
    slow = run_pipeline("1f1b", 4, 8, 1, fwd, bwd, 0.1)
    # fill and drain each cross p - 1 links at least; steady 1F1B round trips can add more
    assert max(slow.end_s) >= base + 2 * 3 * 0.1 - 1e-9
    assert slow.critical_p2p_s[0] >= 0.6 - 1e-9
    assert max(slow.end_s) - slow.critical_p2p_s[0] <= base + 1e-9


@pytest.mark.parametrize("schedule, p, m, v", [("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("gpipe", 3, 6, 1),
                                               ("1f1b", 8, 20, 1)])
def test_recorded_transfers_are_the_ones_the_passes_wait_on(schedule, p, m, v):
    rng = random.Random(1)
    fwd = [[rng.uniform(0.5, 1.5) / v for _ in range(v)] for _ in range(p)]
    bwd = [[rng.uniform(1.0, 3.0) / v for _ in range(v)] for _ in range(p)]
    run = run_pipeline(schedule, p, m, v, fwd, bwd, 0.07, record=True)
    starts = {(s, b, mb, c): start for s, b, mb, c, start, _ in run.events}
    ends = {(s, b, mb, c): end for s, b, mb, c, _, end in run.events}
    # every pass but the very first forward and the very last backward of a micro-batch receives one transfer
    assert len(run.transfers) == 2 * m * (p * v - 1)
    for src, dst, backward, mb, chunk, start, end in run.transfers:
        assert abs(src - dst) in (1, p - 1) and end == pytest.approx(start + 0.07, rel=1e-12)
        assert starts[(dst, backward, mb, chunk)] >= end - 1e-12  # the receiver starts after its arrival
        assert start in {e for (s, b, i, _), e in ends.items() if s == src and b == backward and i == mb}
    for stage, path in enumerate(run.critical_transfers):
        assert len(path) * 0.07 == pytest.approx(run.critical_p2p_s[stage], rel=1e-9)
        spans = [run.transfers[i] for i in path]
        assert all(a[6] <= b[5] + 1e-12 for a, b in zip(spans, spans[1:]))  # one chain, in time order
        for _, dst, backward, mb, chunk, _, end in spans:  # each bound its receiver's start
            assert starts[(dst, backward, mb, chunk)] == end
