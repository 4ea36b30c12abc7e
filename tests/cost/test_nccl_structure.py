"""The NCCL structure of the collective model: constants from NCCL's tuning.cc, algorithm choice by size
and node count, and the fabric keys (leaves, spine oversubscription)."""

from __future__ import annotations

import dataclasses

import pytest

from echo_tune.config import GroupPlacement, check_compatible, load_cluster, load_model
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.collectives import comm
from echo_tune.cost.collectives import nccl_tuning
from echo_tune.cost.collectives.nccl_tuning import NCCL_VERSION, tree_correction
from echo_tune.cost.profile import LinkCoefficients, load_profile
from echo_tune.errors import ConfigError

from ..calibrate.conftest import A100_DIR

FITTED = load_profile(A100_DIR / "profile.yaml")
MIB = 1 << 20


def _place(nodes: int, per_node: int = 8, **fabric) -> GroupPlacement:
    return GroupPlacement(size=nodes * per_node, ranks_per_node=per_node, num_nodes=nodes, **fabric)


def test_constants_name_their_release():
    assert NCCL_VERSION == "2.30.7"
    assert "5067397c2676" in comm.__doc__ + nccl_tuning.__doc__


def test_tree_correction_follows_ncclTopoGetAlgoTime():
    # log2(nBytes / 64): 1 MiB -> 14 (.5 for Simple), 16 MiB -> 18 (.7), 512 MiB -> 23 (outside the table: 1)
    assert tree_correction("simple", MIB) == 0.5
    assert tree_correction("simple", 16 * MIB) == 0.7
    assert tree_correction("ll128", MIB) == 0.6
    assert tree_correction("simple", 512 * MIB) == 1.0
    assert tree_correction("simple", 32) == 1.0


def _winner(size: float, place: GroupPlacement) -> str:
    """The algorithm of the fastest tier, each tier running what NCCL's tuner picks."""
    best = None
    pairs = comm._tier_pairs(FITTED, "all_reduce", place)
    for protocol, intra, inter in pairs:
        if inter is not None and comm._nccl_runs_tree(protocol, size, place, pairs[0][1], pairs[0][2]):
            option = (comm._tree_time_s(protocol, size, place, intra, inter), "tree")
        else:
            option = (comm._ring_time_s("all_reduce", protocol, size, place, intra, inter), "ring")
        if best is None or option[0] < best[0]:
            best = option
    assert best[0] == comm.collective_time_s("all_reduce", size, place, FITTED)
    return best[1]


def test_nccl_choice_reads_the_graph_bandwidth_not_the_protocol_tier(monkeypatch):
    """NCCL's tuner has one graph bandwidth per algorithm and applies the protocol factors to it, so every
    protocol tier's tree/ring choice is made on the Simple tiers' links, never on a lower tier's own fit
    (a curve fitted at small sizes, e.g. LL128 at 31.6 GB/s on NVLink in the shipped A100 profile)."""
    intra, inter = FITTED.link("intra_node", "all_reduce"), FITTED.link("inter_node", "all_reduce")
    assert intra.protocols["ll128"].bus_bandwidth_gbyte_s < intra.bus_bandwidth_gbyte_s / 4
    seen = []
    real = comm._nccl_runs_tree

    def spy(protocol, size, place, graph_intra, graph_inter):
        seen.append((protocol, graph_intra, graph_inter))
        return real(protocol, size, place, graph_intra, graph_inter)

    monkeypatch.setattr(comm, "_nccl_runs_tree", spy)
    comm.collective_time_s("all_reduce", 64 * MIB, _place(16), FITTED)
    assert [p for p, _, _ in seen] == ["simple", "ll128", "ll"]
    assert all(a is intra and b is inter for _, a, b in seen)
    # and the choice is NCCL's tuner on the Simple graph bandwidth (past two nodes: the NICs, 8 per node)
    graph_gbyte_s = min(intra.bus_bandwidth_gbyte_s, 8 * inter.bus_bandwidth_gbyte_s)
    for size in (MIB, 16 * MIB, 256 * MIB):
        assert real("ll128", size, _place(16), intra, inter) == nccl_tuning.nccl_picks_tree(
            "ll128", size, 128, 16, 8, graph_gbyte_s * 1e3)


def test_algorithm_choice_by_size_and_node_count():
    # inside a node: rings only; across 16 nodes mid sizes take the tree (logarithmic latency)
    assert _winner(16 * MIB, _place(1)) == "ring"
    assert _winner(16 * MIB, _place(16)) == "tree"
    # NCCL's latency structure: ring latency grows with 2(N-1) network hops, the tree's with 2 log2(N)
    simple = [(FITTED.link("intra_node", "all_reduce"), FITTED.link("inter_node", "all_reduce"))][0]
    ring = {n: comm._ring_time_s("all_reduce", "simple", 1, _place(n), *simple) for n in (2, 4, 16)}
    tree = {n: comm._tree_time_s("simple", 1, _place(n), *simple) for n in (2, 4, 16)}
    assert ring[16] - ring[2] > 4 * (ring[4] - ring[2])
    assert tree[16] - tree[2] == pytest.approx(3 * (tree[4] - tree[2]), rel=1e-6)


def test_nccl_tuner_choice_by_size_and_node_count():
    # NCCL's tuner (its own latencies and bandwidth ratios): with two nodes the tree for medium
    # sizes, the ring once the tree's lower bandwidth (.92 x .5 x treeCorrectionFactor vs the ring's
    # n / 2(n-1)) outweighs its latency; the ring's latency grows with 2(N-1) network hops, so at 16
    # nodes the tree runs up to much larger sizes
    assert [_winner(s * MIB, _place(2)) for s in (1, 8, 64, 1024)] == ["tree", "tree", "ring", "ring"]
    assert [_winner(s * MIB, _place(16)) for s in (1, 8, 64, 128)] == ["tree"] * 4
    assert _winner(4096 * MIB, _place(16)) == "ring"
    # the estimate itself: ring Simple at 16 GPUs on 2 nodes, 28 NVLink steps at max(3.4, 3 x 1.0) us
    # and 2 network steps at 14 us, times the 1.4 plateau, against the tree's 8.4 + 2 (7 x 4 + 14) us
    # at 1 byte; 100 GB/s of graph bandwidth
    assert nccl_tuning.nccl_picks_tree("simple", 1, 16, 2, 8, 1e5)
    assert not nccl_tuning.nccl_picks_tree("simple", 1 << 30, 16, 2, 8, 1e5)


def test_two_node_tree_is_bound_by_nvlink_past_two_by_the_network():
    intra, inter = FITTED.link("intra_node", "all_reduce"), FITTED.link("inter_node", "all_reduce")
    size = 1 << 30  # treeCorrectionFactor 1: the slope is the bound

    def slope(nodes: int) -> float:
        return (comm._tree_time_s("simple", 2 * size, _place(nodes), intra, inter)
                - comm._tree_time_s("simple", size, _place(nodes), intra, inter))

    nvlink = intra.bus_bandwidth_gbyte_s * inter.tree_efficiency
    network = 8 * inter.bus_bandwidth_gbyte_s
    assert nvlink < 2 * network  # the fitted two-node tree is NVLink-bound
    assert slope(4) / slope(2) == pytest.approx(nvlink / network, rel=1e-6)
    assert slope(16) == pytest.approx(slope(4), rel=1e-6)


def test_tree_never_beats_the_links():
    size = 8 << 30
    ring_bound = size * comm.bus_factor("all_reduce", 128) / (8 * FITTED.link("inter_node", "all_reduce")
                                                             .bus_bandwidth_gbyte_s * 1e9)
    assert comm.collective_time_s("all_reduce", size, _place(16), FITTED) >= ring_bound


def test_spine_oversubscription_slows_groups_that_span_leaves():
    flat = comm.collective_time_s("all_reduce", 1 << 30, _place(4), FITTED)
    one_leaf = comm.collective_time_s("all_reduce", 1 << 30, _place(4, num_leaves=1, spine_oversubscription=2.0),
                                      FITTED)
    two_leaves = comm.collective_time_s("all_reduce", 1 << 30, _place(4, num_leaves=2, spine_oversubscription=2.0),
                                        FITTED)
    assert one_leaf == flat and two_leaves == pytest.approx(2 * flat, rel=0.05)


def test_cluster_fabric_keys_reach_the_group_placements():
    cluster = load_cluster("a100-80gb")
    assert cluster.nodes_per_leaf is None and cluster.spine_oversubscription == 1.0  # defaults: flat fabric
    fabric = cluster.replace(nodes_per_leaf=4, spine_oversubscription=2.0)
    parallel = ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=1, global_batch_size=64)
    layout = check_compatible(load_model("gpt-1.7b"), fabric, 64, parallel)
    dp = layout.groups["dp"]
    assert (dp.num_nodes, dp.num_leaves, dp.spine_oversubscription) == (8, 2, 2.0)
    assert layout.groups["tp"].num_leaves == 1
    flat = check_compatible(load_model("gpt-1.7b"), cluster, 64, parallel).groups["dp"]
    assert flat.num_leaves == 1
    with pytest.raises(ConfigError, match="spine_oversubscription >= 1"):
        cluster.replace(spine_oversubscription=0.5)


def test_collective_time_is_pure_and_deterministic():
    place = _place(16)
    first = [comm.collective_time_s(c, 3 * MIB, place, FITTED) for c in comm.COLLECTIVES]
    again = [comm.collective_time_s(c, 3 * MIB, place, FITTED) for c in comm.COLLECTIVES]
    assert first == again and all(t > 0 for t in first)
    # a profile tier's tree efficiency is read only for crossing all-reduce trees
    link = FITTED.link("inter_node", "all_reduce")
    assert isinstance(link, LinkCoefficients) and link.tree_efficiency > 0
    assert dataclasses.replace(link, tree_efficiency=1.0).to_dict().get("tree_efficiency") is None
