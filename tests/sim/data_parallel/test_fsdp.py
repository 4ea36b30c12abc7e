"""sim/data_parallel/fsdp.py: per-unit all-gathers / reduce-scatters and their exposure, worked by hand, and the step."""

from types import SimpleNamespace

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import profile_for
from echo_tune.sim.data_parallel.fsdp import Unit, pass_cost, unit_comm_s
from echo_tune.sim.outputs.report import BREAKDOWN_PARTS

# comm slowed 1.5x and compute 1.2x where they overlap (constant curves: no message-size dependence)
PROFILE = SimpleNamespace(slowdown_curves=None, comm_slowdown=1.5, compute_slowdown=1.2)
FSDP = et.ParallelConfig(use_megatron_fsdp=True, global_batch_size=64)
MODEL, H100 = et.load_model("llama3-8b"), et.load_cluster("h100-sxm")


def test_forward_gather_longer_than_compute_is_partly_exposed():
    # 4 units, all-gather 2 ms (3 ms slowed), compute 2 ms: the first gather waits (2 ms), each of the
    # next 3 is prefetched behind the previous unit's 2 ms and shows 3 - 2 = 1 ms: 2 + 3 x 1 = 5 ms;
    # interference: 3 overlaps of 2 ms x (1.2 - 1) = 1.2 ms
    cost = pass_cost([Unit(gather_s=2e-3, compute_s=2e-3)] * 4, PROFILE, backward=False)
    assert cost.dp_comm_s == pytest.approx(5e-3)
    assert cost.interference_s == pytest.approx(1.2e-3)


def test_forward_gather_shorter_than_compute_is_hidden_but_the_first():
    # gather 1 ms (1.5 slowed) behind 4 ms of compute: hidden; only the first unit's 1 ms waits
    cost = pass_cost([Unit(gather_s=1e-3, compute_s=4e-3)] * 4, PROFILE, backward=False)
    assert cost.dp_comm_s == pytest.approx(1e-3)
    assert cost.interference_s == pytest.approx(3 * 1.5e-3 * 0.2)


def test_backward_overlaps_next_gather_and_previous_reduce_scatter():
    # 3 units, gather 1 ms, reduce-scatter 1 ms, compute 2.5 ms. Exposed: first gather 1 ms; beside unit 0:
    # gather 1 (1.5 slowed) hidden; unit 1: gather + reduce 2 ms (3 slowed) -> 0.5 ms; unit 2: reduce 1 ms
    # (1.5) hidden; the last reduce-scatter 1 ms after the pass: 1 + 0.5 + 1 = 2.5 ms
    units = [Unit(gather_s=1e-3, reduce_s=1e-3, compute_s=2.5e-3)] * 3
    assert pass_cost(units, PROFILE, backward=True).dp_comm_s == pytest.approx(2.5e-3)


def test_unit_all_gather_is_the_bf16_layer_over_the_dp_group():
    profile = profile_for(H100)
    dp = GroupPlacement(size=8, ranks_per_node=8, num_nodes=1)
    layer = 218_112_000  # Llama-3 8B layer: 2h^2 + 2h x 1024 + 3h x 14336 + 2h at h = 4096
    gather, reduce, size = unit_comm_s(FSDP, layer, 0, dp, None, profile)
    assert size == 2 * layer  # bf16: 436 MB gathered per layer and pass
    assert gather == collective_time_s("all_gather", 2 * layer, dp, profile)
    assert reduce == collective_time_s("reduce_scatter", 2 * layer, dp, profile)  # bf16 grads (auto)
    # optim_grads keeps the weights whole: no all-gather in the passes, reduce-scatter still per unit
    assert unit_comm_s(FSDP.replace(data_parallel_sharding_strategy="optim_grads"), layer, 0, dp, None,
                       profile)[0] == 0.0


@pytest.mark.parametrize("strategy", ["no_shard", "optim", "optim_grads", "optim_grads_params"])
def test_each_strategy_simulates_with_the_breakdown_summing_to_the_step(strategy):
    report = et.simulate(MODEL, H100, 16, FSDP.replace(data_parallel_sharding_strategy=strategy))
    assert tuple(report.breakdown_s) == BREAKDOWN_PARTS
    assert sum(report.breakdown_s.values()) == pytest.approx(report.step_time_s, rel=1e-9)
    assert report.breakdown_s["other"] == pytest.approx(0.0, abs=1e-9)


def test_zero3_exposed_gathers_are_dp_comm_and_in_the_trace():
    report = et.simulate(MODEL, H100, 16, FSDP.replace(micro_batch_size=1), timeline=True)
    assert report.breakdown_s["dp_comm"] > 0
    spans = [s for s in report.timeline if s[2] == "dp_comm" and "FSDP" in s[1]]
    assert spans and all(end > start for _, _, _, start, end in spans)
