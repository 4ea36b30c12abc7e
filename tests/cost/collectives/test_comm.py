"""The collective model: the nccl-tests conventions, and monotonicity in bandwidth and size."""

import dataclasses

import pytest

from echo_tune.config import GroupPlacement, load_cluster
from echo_tune.cost.collectives.comm import bus_factor, collective_time_s
from echo_tune.cost.profile import LinkCoefficients, default_profile

A100 = load_cluster("a100-40gb")
PROFILE = default_profile(A100)
NODE = GroupPlacement(size=8, ranks_per_node=8, num_nodes=1)
TWO_NODES = GroupPlacement(size=16, ranks_per_node=8, num_nodes=2)


def test_bus_factors_follow_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("all_gather", 8) == pytest.approx(7 / 8)
    assert bus_factor("send_recv", 2) == 1.0


def test_large_all_reduce_runs_at_bus_bandwidth():
    size = 1 << 30
    t = collective_time_s("all_reduce", size, NODE, PROFILE)
    bus = PROFILE.link("intra_node", "all_reduce").bus_bandwidth_gbyte_s * 1e9
    assert t == pytest.approx(2 * 7 / 8 * size / bus, rel=0.01)


def test_group_of_one_costs_nothing():
    assert collective_time_s("all_reduce", 1 << 20, GroupPlacement(size=1, ranks_per_node=1, num_nodes=1),
                             PROFILE) == 0.0


def test_crossing_nodes_is_slower_and_ring_uses_every_nic_of_the_group():
    size = 1 << 30
    one = collective_time_s("all_reduce", size, NODE, PROFILE)
    two = collective_time_s("all_reduce", size, TWO_NODES, PROFILE)
    assert two > one
    # 8 ranks per node share 8 NICs; 1 rank per node (TP=8 DP groups) gets one NIC share
    sparse = collective_time_s("all_reduce", size, GroupPlacement(size=16, ranks_per_node=1, num_nodes=16), PROFILE)
    assert sparse > 4 * two


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather", "reduce_scatter", "send_recv"])
@pytest.mark.parametrize("place", [NODE, TWO_NODES, GroupPlacement(size=64, ranks_per_node=1, num_nodes=64)])
def test_more_bandwidth_never_slower_and_bigger_never_faster(collective, place):
    faster = dataclasses.replace(PROFILE, comm={
        scope: {name: LinkCoefficients(latency_s=c.latency_s, bus_bandwidth_gbyte_s=2 * c.bus_bandwidth_gbyte_s)
                for name, c in table.items()} for scope, table in PROFILE.comm.items()})
    sizes = [1 << k for k in range(10, 34, 2)]
    times = [collective_time_s(collective, s, place, PROFILE) for s in sizes]
    assert times == sorted(times)
    for s in sizes:
        assert collective_time_s(collective, s, place, faster) <= collective_time_s(collective, s, place, PROFILE)


def test_remembered_times_belong_to_their_profile():
    """collective_time_s remembers times per profile object: another profile (a faster network) asking the
    same (collective, size, group) gets its own time, not the first profile's."""
    from echo_tune.cost.collectives.comm import _collective_time_s

    size = 1 << 28
    first = collective_time_s("all_reduce", size, TWO_NODES, PROFILE)
    assert first == _collective_time_s("all_reduce", size, TWO_NODES, PROFILE)
    inter = PROFILE.comm["inter_node"]
    faster = dataclasses.replace(PROFILE, comm={**PROFILE.comm, "inter_node": {
        name: dataclasses.replace(link, bus_bandwidth_gbyte_s=4 * link.bus_bandwidth_gbyte_s)
        for name, link in inter.items()}})
    assert collective_time_s("all_reduce", size, TWO_NODES, faster) < first
    assert collective_time_s("all_reduce", size, TWO_NODES, PROFILE) == first
