"""Collective time: a latency-bandwidth model per collective and protocol, ring and tree, intra- vs inter-node.

Sizes follow nccl-tests' "size" convention (see workload/graph.py) and bandwidths its "busbw"
convention, so a profile fitted from nccl-tests logs plugs in directly. For each protocol tier of
the profile (the large-message tier, plus optional tiers such as NCCL's LL and LL128):

    time = base_latency_s + sum of per-step latencies + bus_factor(n) * size_bytes / bus_bandwidth

and the collective takes its fastest tier, the structure of NCCL's own tuner (src/graph/tuning.cc:
latency = baseLat + steps x hwLat per algorithm and protocol, bandwidth x a protocol factor).

Inside one node the NVLink coefficients apply. A ring over N nodes with g members per node makes
``2(N-1)`` (all-reduce) or ``N-1`` network hops and pays the inter-node step latency on those only,
the intra-node one on the rest (NCCL's nInterSteps). Its slowest hop crosses the network: its bus
bandwidth is min(NVLink bus bandwidth, g x one GPU's NIC share), because the group's g ring
channels each leave through their own NIC share (this is what lets a profile measured on one or two
nodes predict hundreds). All-reduce across nodes may also use NCCL's tree (log2 N network steps);
like NCCL's tuner we take the faster of the two.
"""

from __future__ import annotations

import math

from echo_tune.config.compatibility import GroupPlacement
from echo_tune.cost.profile import CalibrationProfile, LinkCoefficients


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor: the share of the buffer each rank sends."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # send_recv, broadcast


def ring_steps(collective: str, n: int) -> int:
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective == "send_recv":
        return 1
    return n - 1


def inter_node_steps(collective: str, num_nodes: int) -> int:
    """Ring steps that cross the network when a ring spans ``num_nodes`` nodes (NCCL's nInterSteps)."""
    return 2 * (num_nodes - 1) if collective == "all_reduce" else num_nodes - 1


def _crossing_bandwidth_bps(intra: LinkCoefficients, inter: LinkCoefficients, place: GroupPlacement) -> float:
    return min(intra.bus_bandwidth_gbyte_s, place.ranks_per_node * inter.bus_bandwidth_gbyte_s) * 1e9


def _ring_time_s(collective: str, size_bytes: float, place: GroupPlacement,
                 intra: LinkCoefficients, inter: LinkCoefficients | None) -> float:
    n = place.size
    steps = ring_steps(collective, n)
    if not place.crosses_nodes:
        return intra.base_latency_s + steps * intra.latency_s + \
            bus_factor(collective, n) * size_bytes / (intra.bus_bandwidth_gbyte_s * 1e9)
    network_steps = min(steps, inter_node_steps(collective, place.num_nodes))
    latency = inter.base_latency_s + (steps - network_steps) * intra.latency_s + network_steps * inter.latency_s
    return latency + bus_factor(collective, n) * size_bytes / _crossing_bandwidth_bps(intra, inter, place)


def _tree_time_s(size_bytes: float, place: GroupPlacement, intra: LinkCoefficients,
                 inter: LinkCoefficients) -> float:
    """NCCL's tree all-reduce: a chain inside each node, a double binary tree across nodes."""
    latency = inter.base_latency_s + 2 * (math.ceil(math.log2(place.num_nodes)) * inter.latency_s
                                          + (place.ranks_per_node - 1) * intra.latency_s)
    return latency + 2.0 * size_bytes / _crossing_bandwidth_bps(intra, inter, place)


def _tier_pairs(profile: CalibrationProfile, collective: str,
                place: GroupPlacement) -> list[tuple[LinkCoefficients, LinkCoefficients | None]]:
    """(intra, inter) coefficients of each protocol tier usable by this group."""
    intra_tiers = profile.link("intra_node", collective).tiers()
    if not place.crosses_nodes:
        return [(tier, None) for tier in intra_tiers.values()]
    inter_tiers = profile.link("inter_node", collective).tiers()
    return [(intra_tiers[name], inter_tiers[name]) for name in intra_tiers if name in inter_tiers]


def _send_recv_time_s(size_bytes: float, place: GroupPlacement, profile: CalibrationProfile) -> float:
    scope = "inter_node" if place.crosses_nodes else "intra_node"
    return min(link.base_latency_s + link.latency_s + size_bytes / (link.bus_bandwidth_gbyte_s * 1e9)
               for link in profile.link(scope, "send_recv").tiers().values())


def _all_to_all_time_s(size_bytes: float, place: GroupPlacement, intra: LinkCoefficients,
                       inter: LinkCoefficients) -> float:
    """All-to-all across nodes: NCCL sends to every peer at once (no ring), so each rank's NIC share
    carries the (n - g)/n of its buffer bound for other nodes while NVLink carries the (g - 1)/n for
    its node; the slower of the two sets the time (g = ranks per node)."""
    n, g = place.size, place.ranks_per_node
    latency = inter.base_latency_s + (g - 1) * intra.latency_s + (place.num_nodes - 1) * inter.latency_s
    return latency + max((g - 1) / n * size_bytes / (intra.bus_bandwidth_gbyte_s * 1e9),
                         (n - g) / n * size_bytes / (inter.bus_bandwidth_gbyte_s * 1e9))


def collective_time_s(collective: str, size_bytes: float, place: GroupPlacement,
                      profile: CalibrationProfile) -> float:
    """Time of one collective over a group placed as ``place`` (0 for a group of one)."""
    if size_bytes <= 0:
        return 0.0
    if collective == "send_recv":
        return _send_recv_time_s(size_bytes, place, profile)
    if place.size <= 1:
        return 0.0
    times = []
    for intra, inter in _tier_pairs(profile, collective, place):
        if collective == "all_to_all" and place.crosses_nodes:
            times.append(_all_to_all_time_s(size_bytes, place, intra, inter))
            continue
        times.append(_ring_time_s(collective, size_bytes, place, intra, inter))
        if collective == "all_reduce" and place.crosses_nodes:
            times.append(_tree_time_s(size_bytes, place, intra, inter))
    return min(times)
