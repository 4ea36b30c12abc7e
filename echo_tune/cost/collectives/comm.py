"""Collective time: NCCL's own cost structure, with the cluster's link terms from a profile.

Sizes follow nccl-tests' "size" convention (see workload/graph.py) and bandwidths its "busbw"
convention, so a profile fitted from nccl-tests logs plugs in directly. The structure is NCCL's
tuner (``src/graph/tuning.cc``; the fixed constants and their release are in ``cost/collectives/nccl_tuning.py``):
per collective, every enabled (algorithm, protocol) pair has

    time = latency + size_bytes / algorithm_bandwidth

and, per protocol tier, NCCL's own choice of algorithm: an all-reduce across nodes runs as a tree
where NCCL's tuner, on its own constants (``nccl_tuning.nccl_picks_tree``), estimates the tree
faster, else as a ring; the collective then takes the fastest tier. The profile gives one *tier* per
protocol measured (``simple``, ``ll128``, ``ll``) and per scope (``intra_node`` = NVLink inside a
node, ``inter_node`` = the network), each with a per-call latency, a per-hop latency and a bus
bandwidth (inter_node: one GPU's share of its node's NICs). From those:

* **ring** (every collective): ``nsteps`` hops (2(n-1) all-reduce, n-1 all-gather / reduce-scatter /
  all-to-all), of which ``nInterSteps`` = 2(N-1) (all-reduce) or N-1 cross the network and pay the
  network hop latency, the rest the NVLink one. Bus bandwidth min(NVLink, g x NIC share) for g
  members per node: each of a node's ring channels leaves through its own NIC. Across nodes the
  Simple all-reduce ring's latency takes NCCL's plateau factor.
* **tree** (all-reduce across nodes): a chain inside each node and a double binary tree across
  nodes, 2((g-1) NVLink hops + floor(log2 N) network hops, NCCL's log2i: ``nccl_tuning.tree_depth``) at NCCL's tree/ring hop-latency ratios, moving
  the buffer twice at NCCL's tree/ring bandwidth ratio per protocol times NCCL's medium-size
  ``treeCorrectionFactor``. What binds it depends on the node count, as in NCCL's tuner (``bw =
  nNodes <= 2 ? bwIntra : bwInter``): with two nodes each node's NICs carry half the buffer per
  phase, so the NVLink chain binds, at the fitted ``tree_efficiency`` (chain bandwidth / NVLink
  ring bandwidth), unless twice the network is slower; past two nodes the network binds, as for a
  ring. This is the measured step of 4-8 MiB all-reduces from 2 to 4 nodes.
* **all_to_all**: NCCL runs it as send/recv with every peer at once, so across nodes the share of
  a rank's buffer bound for other nodes, (n-g)/n, goes through that rank's own NIC share (the
  node's NICs are not shared out g-fold as by a ring); the NVLink share (g-1)/n goes in parallel.
* **broadcast**: a pipelined ring (one hop latency per call, bus factor 1).
* **send_recv**: one hop on the scope the two peers share.

A group that spans leaf switches of an oversubscribed fabric (``GroupPlacement.num_leaves > 1``)
has its network bandwidth divided by ``spine_oversubscription``. A "node" here is whatever
``GroupPlacement`` calls one: the NVLink domain of the intra_node coefficients.

Not modelled: NVLS / NVLS-tree / CollNet / PAT (no such hardware in the calibration data), NCCL's
per-channel caps (perChMaxTreeBws, llMaxBws: they need NCCL's channel count and do not bind at
NIC-bound rates of ~8 GB/s per channel), its size-dependent channel count (the fitted tiers absorb
it), NCCL's protocol choice (the tiers are fitted curves, taken at their fastest) and the CPU
vendor's network overhead (NCCL's default, 1 us, is used).

The function is pure and cheap (no allocation beyond a few floats), so callers may cache it.
"""

from __future__ import annotations

import math

from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.cost.collectives.nccl_tuning import (RING_SIMPLE_PLATEAU, TREE_ALGBW_RATIO, TREE_VS_RING_BANDWIDTH,
                                        TREE_VS_RING_NET_HOP, TREE_VS_RING_NVLINK_HOP, nccl_picks_tree,
                                        tier_protocol, tree_correction, tree_depth)
from echo_tune.cost.profile import ClusterProfile, LinkCoefficients
from echo_tune.identity_cache import IdentityCache

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw / algbw factor: the share of the buffer each rank sends."""
    if collective == "all_reduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0  # send_recv, broadcast


def ring_steps(collective: str, n: int) -> int:
    """NCCL's ``nsteps`` of a ring (tuning.cc: 2(n-1) all-reduce, n-1 all-gather / reduce-scatter)."""
    if collective == "all_reduce":
        return 2 * (n - 1)
    if collective == "send_recv":
        return 1
    return n - 1


def inter_node_steps(collective: str, num_nodes: int) -> int:
    """NCCL's ``nInterSteps``: ring hops that cross the network."""
    return 2 * (num_nodes - 1) if collective == "all_reduce" else num_nodes - 1


def _network_bandwidth_bps(intra: LinkCoefficients, inter: LinkCoefficients, place: GroupPlacement) -> float:
    """Bus bandwidth of a group's crossing ring: its g channels per node each leave through a NIC share."""
    nic = place.ranks_per_node * inter.bus_bandwidth_gbyte_s
    if place.num_leaves > 1:
        nic /= place.spine_oversubscription
    return min(intra.bus_bandwidth_gbyte_s, nic) * 1e9


def _ring_time_s(collective: str, protocol: str, size_bytes: float, place: GroupPlacement,
                 intra: LinkCoefficients, inter: LinkCoefficients | None) -> float:
    n = place.size
    steps = ring_steps(collective, n)
    factor = bus_factor(collective, n)
    if collective == "broadcast":  # pipelined: one hop latency per call, whatever the ring length
        steps = 1
    if inter is None:
        return intra.base_latency_s + steps * intra.latency_s + factor * size_bytes / (intra.bus_bandwidth_gbyte_s * 1e9)
    network_steps = min(steps, inter_node_steps(collective, place.num_nodes))
    latency = inter.base_latency_s + (steps - network_steps) * intra.latency_s + network_steps * inter.latency_s
    if collective == "all_reduce" and protocol == "simple":
        latency *= RING_SIMPLE_PLATEAU
    if collective == "all_to_all":
        return latency + _all_to_all_transfer_s(size_bytes, place, intra, inter)
    return latency + factor * size_bytes / _network_bandwidth_bps(intra, inter, place)


def _all_to_all_transfer_s(size_bytes: float, place: GroupPlacement, intra: LinkCoefficients,
                           inter: LinkCoefficients) -> float:
    """NCCL's all-to-all is send/recv with every peer at once: (g-1)/n of a rank's buffer goes over
    NVLink, (n-g)/n through its own NIC share (no ring shares the node's NICs), the slower one bounds it."""
    n, g = place.size, place.ranks_per_node
    nic = inter.bus_bandwidth_gbyte_s / (place.spine_oversubscription if place.num_leaves > 1 else 1.0)
    return max((g - 1) / n * size_bytes / (intra.bus_bandwidth_gbyte_s * 1e9),
               (n - g) / n * size_bytes / (nic * 1e9))


def _tree_time_s(protocol: str, size_bytes: float, place: GroupPlacement, intra: LinkCoefficients,
                 inter: LinkCoefficients) -> float:
    """NCCL's tree all-reduce: a chain inside each node, a double binary tree across nodes."""
    latency = inter.base_latency_s + 2 * (
        tree_depth(place.num_nodes) * inter.latency_s * TREE_VS_RING_NET_HOP[protocol]
        + (place.ranks_per_node - 1) * intra.latency_s * TREE_VS_RING_NVLINK_HOP[protocol])
    # What binds the tree depends on the node count (NCCL's tuner: ``bw = nNodes <= 2 ? bwIntra :
    # bwInter``, and NVLS-tree's ``bwInter * 2`` at nNodes <= 2). With two nodes each node is the root
    # of one binary tree and the leaf of the other, so its NICs carry half the buffer per phase and the
    # NVLink chain inside the node binds (at the fitted tree_efficiency of that chain); past two nodes
    # each node is an inner node (two children, one parent) of one tree, its NICs carry the whole
    # buffer as a ring's do, and the network binds at NCCL's tree/ring ratio.
    relief = 2.0 if place.num_nodes == 2 else 1.0
    links_bps = min(intra.bus_bandwidth_gbyte_s * 1e9 * inter.tree_efficiency,
                    relief * _network_bandwidth_bps(intra, inter, place))
    ratio = TREE_ALGBW_RATIO * TREE_VS_RING_BANDWIDTH[protocol] * tree_correction(protocol, size_bytes)
    return latency + size_bytes / (links_bps * ratio)


def _nccl_runs_tree(protocol: str, size_bytes: float, place: GroupPlacement, intra: LinkCoefficients,
                    inter: LinkCoefficients) -> bool:
    """NCCL runs the tree when its tuner, on its own constants, estimates it faster than the ring."""
    if place.num_nodes <= 2:
        graph_bps = intra.bus_bandwidth_gbyte_s * 1e9
    else:
        graph_bps = _network_bandwidth_bps(intra, inter, place)
    return nccl_picks_tree(protocol, size_bytes, place.size, place.num_nodes, place.ranks_per_node,
                           graph_bps * 1e-6)


def _tier_pairs(profile: ClusterProfile, collective: str,
                place: GroupPlacement) -> list[tuple[str, LinkCoefficients, LinkCoefficients | None]]:
    """(protocol, intra, inter) coefficients of each protocol tier usable by this group."""
    intra_tiers = profile.link("intra_node", collective).tiers()
    if not place.crosses_nodes:
        return [(tier_protocol(name), tier, None) for name, tier in intra_tiers.items()]
    inter_tiers = profile.link("inter_node", collective).tiers()
    return [(tier_protocol(name), intra_tiers[name], inter_tiers[name])
            for name in intra_tiers if name in inter_tiers]


def _send_recv_time_s(size_bytes: float, place: GroupPlacement, profile: ClusterProfile) -> float:
    scope = "inter_node" if place.crosses_nodes else "intra_node"
    best = math.inf
    for link in profile.link(scope, "send_recv").tiers().values():
        bandwidth = link.bus_bandwidth_gbyte_s
        if place.crosses_nodes and place.num_leaves > 1:
            bandwidth /= place.spine_oversubscription
        best = min(best, link.base_latency_s + link.latency_s + size_bytes / (bandwidth * 1e9))
    return best


_TIMES = IdentityCache(limit=200_000)


def collective_time_s(collective: str, size_bytes: float, place: GroupPlacement,
                      profile: ClusterProfile) -> float:
    """Time of one collective over a group placed as ``place`` (0 for a group of one).

    Remembered per profile object (profiles and placements are frozen): a search asks for the same few
    thousand (collective, size, group) triples millions of times (every bucket of every stage)."""
    return _TIMES.get((profile,), (collective, size_bytes, place),
                      lambda: _collective_time_s(collective, size_bytes, place, profile))


def _collective_time_s(collective: str, size_bytes: float, place: GroupPlacement,
                       profile: ClusterProfile) -> float:
    if size_bytes <= 0:
        return 0.0
    if collective == "send_recv":
        return _send_recv_time_s(size_bytes, place, profile)
    if place.size <= 1:
        return 0.0
    best = math.inf
    pairs = _tier_pairs(profile, collective, place)
    _, simple_intra, simple_inter = pairs[0]  # NCCL's graph bandwidth: one per algorithm, whatever the protocol
    for protocol, intra, inter in pairs:
        tree = inter is not None and collective == "all_reduce" and not profile.nccl_ring_only
        if tree and _nccl_runs_tree(protocol, size_bytes, place, simple_intra, simple_inter):
            best = min(best, _tree_time_s(protocol, size_bytes, place, intra, inter))
        else:
            best = min(best, _ring_time_s(collective, protocol, size_bytes, place, intra, inter))
    return best
