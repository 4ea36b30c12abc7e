"""Collective time: a latency-bandwidth model per collective, ring and tree, intra- vs inter-node.

Sizes follow nccl-tests' "size" convention (see workload/graph.py) and bandwidths its "busbw"
convention, so a profile fitted from nccl-tests logs plugs in directly:

    time = steps * latency_s + bus_factor(n) * size_bytes / bus_bandwidth

Inside one node the NVLink coefficients apply. A group spread over N nodes with g members per node
runs a ring whose slowest hop crosses the network: its bus bandwidth is min(NVLink bus bandwidth,
g x one GPU's NIC share), because the group's g ring channels each leave through their own NIC share
(this is what lets a profile measured on one or two nodes predict hundreds). All-reduce across nodes
may also use NCCL's tree (log2 N network steps); like NCCL's tuner we take the faster of the two.
"""

from __future__ import annotations

import math

from echo_tune.config.compatibility import GroupPlacement
from echo_tune.cost.profile import CalibrationProfile


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


def _ring_time_s(collective: str, size_bytes: float, place: GroupPlacement,
                 profile: CalibrationProfile) -> float:
    n = place.size
    intra = profile.link("intra_node", collective)
    if not place.crosses_nodes:
        return ring_steps(collective, n) * intra.latency_s + \
            bus_factor(collective, n) * size_bytes / (intra.bus_bandwidth_gbyte_s * 1e9)
    inter = profile.link("inter_node", collective)
    bandwidth = min(intra.bus_bandwidth_gbyte_s, place.ranks_per_node * inter.bus_bandwidth_gbyte_s) * 1e9
    return ring_steps(collective, n) * inter.latency_s + bus_factor(collective, n) * size_bytes / bandwidth


def _tree_time_s(size_bytes: float, place: GroupPlacement, profile: CalibrationProfile) -> float:
    """NCCL's tree all-reduce: a chain inside each node, a double binary tree across nodes."""
    intra, inter = profile.link("intra_node", "all_reduce"), profile.link("inter_node", "all_reduce")
    latency = 2 * (math.ceil(math.log2(place.num_nodes)) * inter.latency_s
                   + (place.ranks_per_node - 1) * intra.latency_s)
    bandwidth = min(intra.bus_bandwidth_gbyte_s, place.ranks_per_node * inter.bus_bandwidth_gbyte_s) * 1e9
    return latency + 2.0 * size_bytes / bandwidth


def collective_time_s(collective: str, size_bytes: float, place: GroupPlacement,
                      profile: CalibrationProfile) -> float:
    """Time of one collective over a group placed as ``place`` (0 for a group of one)."""
    if size_bytes <= 0:
        return 0.0
    if collective == "send_recv":
        scope = "inter_node" if place.crosses_nodes else "intra_node"
        link = profile.link(scope, collective)
        return link.latency_s + size_bytes / (link.bus_bandwidth_gbyte_s * 1e9)
    if place.size <= 1:
        return 0.0
    ring = _ring_time_s(collective, size_bytes, place, profile)
    if collective == "all_reduce" and place.crosses_nodes:
        return min(ring, _tree_time_s(size_bytes, place, profile))
    return ring
