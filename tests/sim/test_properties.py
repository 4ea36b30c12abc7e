"""Property tests of the simulator (hypothesis, issue 10): any layout of a small model either simulates
to finite, positive, consistent numbers or is refused with a one-line ConfigError; the periodic
extrapolation equals the task-by-task run; the closed-form live counts equal the orders they replace;
a larger global batch never takes less time."""

from __future__ import annotations

import math

from hypothesis import event, given, settings
from hypothesis import strategies as st

from echo_tune.config.load.loading import load_cluster, load_model
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule import engine
from echo_tune.sim.schedule.schedules import live_count_vectors, stage_order
from echo_tune.sim.simulate import simulate

MODEL = load_model("gpt-1.7b")
CLUSTER = load_cluster("a100-80gb")
POW2 = st.sampled_from([1, 2, 4, 8])

layouts = st.fixed_dictionaries({
    "tensor_model_parallel_size": POW2, "pipeline_model_parallel_size": POW2,
    "context_parallel_size": st.sampled_from([1, 2]), "micro_batch_size": st.sampled_from([1, 2, 4]),
    "global_batch_size": st.sampled_from([16, 64, 512, 1 << 20]),
    "recompute_granularity": st.sampled_from([None, "selective", "full"]),
    "sequence_parallel": st.booleans(), "use_distributed_optimizer": st.booleans(),
    "overlap_grad_reduce": st.booleans(),
})


@settings(max_examples=40, deadline=None, derandomize=True)
@given(layout=layouts, num_gpus=st.sampled_from([8, 16, 64, 4096]))
def test_any_layout_simulates_sanely_or_is_refused(layout, num_gpus):
    try:
        parallel = ParallelConfig(**layout)
        report = simulate(MODEL, CLUSTER, num_gpus, parallel)
    except ConfigError as exc:
        event("refused")
        assert "\n" not in str(exc) and str(exc)
        return
    event("simulated")
    assert math.isfinite(report.step_time_s) and report.step_time_s > 0
    assert 0 < report.mfu <= 1
    assert report.peak_memory_bytes > 0
    assert math.isclose(sum(report.breakdown_s.values()), report.step_time_s, rel_tol=1e-9)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(layout=layouts.filter(lambda d: d["global_batch_size"] <= 512))
def test_a_larger_batch_never_takes_less_time(layout):
    try:
        small = simulate(MODEL, CLUSTER, 64, ParallelConfig(**layout))
        large = simulate(MODEL, CLUSTER, 64, ParallelConfig(**{**layout,
                                                               "global_batch_size": 2 * layout["global_batch_size"]}))
    except ConfigError:
        event("refused")
        return
    event("compared")
    assert large.step_time_s >= small.step_time_s


durations = st.floats(min_value=1e-4, max_value=1.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(schedule=st.sampled_from(["1f1b", "interleaved", "gpipe", "none"]), p=st.integers(1, 4),
       v=st.integers(1, 3), m_extra=st.integers(0, 40), data=st.data())
def test_extrapolated_pipeline_equals_the_full_run(schedule, p, v, m_extra, data):
    if schedule != "interleaved":
        v = 1
    if schedule == "none":
        p = 1
    m = p * (1 + m_extra // p) if schedule == "interleaved" else 1 + m_extra
    fwd = [[data.draw(durations) for _ in range(v)] for _ in range(p)]
    bwd = [[data.draw(durations) for _ in range(v)] for _ in range(p)]
    p2p = data.draw(st.floats(min_value=0, max_value=0.1))
    fast = engine.simulate_pipeline(schedule, p, m, v, fwd, bwd, p2p)
    full = engine.run_pipeline(schedule, p, m, v, fwd, bwd, p2p)
    for a, b in zip(fast.end_s, full.end_s):
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(schedule=st.sampled_from(["gpipe", "none"]), p=st.integers(1, 6), m=st.integers(1, 60))
def test_closed_form_live_counts_equal_the_order(schedule, p, m):
    stage = p - 1
    live, peak = 0, 0
    for backward, _, _ in stage_order(schedule, stage, p, m, 1):
        live += -1 if backward else 1
        peak = max(peak, live)
    assert live_count_vectors(schedule, stage, p, m, 1) == ((peak,),)
