"""The host's floor under a layer pair of the EP overlap (sim/features/moe_overlap_host.py)."""

from __future__ import annotations

import dataclasses

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.sim.schedule.costing import host_issue_s, phase_cost
from echo_tune.sim.schedule.memo import profile_for_cluster
from echo_tune.sim.features.moe_overlap import ep_overlap_deltas
from echo_tune.sim.features.moe_overlap_host import pair_host_wait_s, with_pair_host_floor
from echo_tune.sim.schedule.passes import trace_pieces
from echo_tune.sim.step_setup import cost_context

US = 1e-6
H100 = et.load_cluster("h100-sxm")
MIXTRAL = et.load_model("mixtral-8x7b").replace(num_layers=8, seq_length=2048)
LAYOUT = et.ParallelConfig(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                           expert_model_parallel_size=8, global_batch_size=64,
                           overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)


def test_pair_waits_for_the_host_to_issue_both_passes():
    # 100 + 150 kernels at 80 us: the host needs 20 ms; a 15 ms pair waits 5 ms, a 25 ms pair not at all
    assert pair_host_wait_s(100 * 80 * US, 150 * 80 * US, 15e-3) == pytest.approx(5e-3)
    assert pair_host_wait_s(100 * 80 * US, 150 * 80 * US, 25e-3) == 0.0
    assert pair_host_wait_s(0.0, 0.0, 1e-3) == 0.0


def _context(host_s: float):
    layout = check_compatible(MIXTRAL, H100, 32, LAYOUT)
    profile = profile_for_cluster(H100)
    profile = dataclasses.replace(profile, fitted={"params": {"host_time_per_kernel_s": host_s}}) if host_s else profile
    pieces = trace_pieces(MIXTRAL, LAYOUT, layout)
    return pieces["moe_layer"], cost_context(MIXTRAL, H100, LAYOUT, layout, profile)


@pytest.mark.parametrize("host_s", [0.0, 5 * US])
def test_no_floor_where_the_host_keeps_up(host_s):
    trace, ctx = _context(host_s)
    fwd, bwd = phase_cost(trace.forward, ctx, piece="moe_layer"), phase_cost(trace.backward, ctx, piece="moe_layer")
    deltas = ep_overlap_deltas(trace, ctx, True)
    assert with_pair_host_floor(trace, ctx, fwd, bwd, deltas) == deltas


def test_host_bound_pair_takes_the_hosts_issue_time():
    trace, ctx = _context(2000 * US)  # far above any kernel's GPU time: the host sets the pace
    fwd, bwd = phase_cost(trace.forward, ctx, piece="moe_layer"), phase_cost(trace.backward, ctx, piece="moe_layer")
    deltas = ep_overlap_deltas(trace, ctx, True)
    assert deltas[0].ep_comm_s < 0  # the overlap hides EP communication on the GPU
    h_fwd, h_bwd = host_issue_s(trace.forward, ctx, piece="moe_layer"), host_issue_s(trace.backward, ctx, piece="moe_layer")
    assert h_fwd > 0 and h_bwd > 0
    floored = with_pair_host_floor(trace, ctx, fwd, bwd, deltas)
    pair_s = fwd.total_s + bwd.total_s + floored[0].total_s + floored[1].total_s
    assert pair_s == pytest.approx(h_fwd + h_bwd)
    # the wait is split by host time and counted as compute; the hidden communication stays hidden
    added_f, added_b = floored[0].compute_s - deltas[0].compute_s, floored[1].compute_s - deltas[1].compute_s
    assert added_f > 0 and added_f / (added_f + added_b) == pytest.approx(h_fwd / (h_fwd + h_bwd))
    assert floored[0].ep_comm_s == deltas[0].ep_comm_s


def test_simulated_step_of_an_overlapped_run_not_below_the_hosts_issue_time():
    profile = dataclasses.replace(profile_for_cluster(H100), fitted={"params": {"host_time_per_kernel_s": 2000 * US}})
    over = et.simulate(MIXTRAL, H100, 32, LAYOUT, profile=profile)
    plain = et.simulate(MIXTRAL, H100, 32, LAYOUT.replace(overlap_moe_expert_parallel_comm=False,
                                                          delay_wgrad_compute=False), profile=profile)
    # host-bound: the same kernels issued by the same host, so hiding the all-to-alls on the GPU saves nothing
    # (without the floor the overlapped step came out 0.3% faster than the plain one)
    assert over.step_time_s >= plain.step_time_s
