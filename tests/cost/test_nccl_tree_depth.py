"""One NCCL tree-depth rule (issue 20 item 5): NCCL's log2i(nNodes) is floor(log2) (src/include/utils.h
``log2i`` = bitops.h ``log2Down`` at NCCL 5067397c2676), for the tree's time and for NCCL's choice alike."""

from __future__ import annotations

import math

import pytest

from echo_tune.config import GroupPlacement
from echo_tune.cost.collectives import comm
from echo_tune.cost.collectives import nccl_tuning
from echo_tune.cost.collectives.nccl_tuning import tree_depth

from ..calibrate.conftest import A100_DIR
from echo_tune.cost.profile import load_profile

FITTED = load_profile(A100_DIR / "profile.yaml")


def test_tree_depth_is_floor_log2():
    assert [tree_depth(n) for n in (1, 2, 3, 4, 5, 7, 8, 9, 1000)] == [0, 1, 1, 2, 2, 2, 3, 3, 9]
    assert all(tree_depth(n) == math.floor(math.log2(n)) for n in range(1, 5000))


def _tree_latency_s(nodes: int) -> float:
    """The tree all-reduce time of a 1-byte buffer (latency only) over ``nodes`` nodes of 8 GPUs."""
    place = GroupPlacement(size=8 * nodes, ranks_per_node=8, num_nodes=nodes)
    pairs = comm._tier_pairs(FITTED, "all_reduce", place)
    protocol, intra, inter = pairs[0]
    return comm._tree_time_s(protocol, 1.0, place, intra, inter)


@pytest.mark.parametrize("nodes,same_as", [(3, 2), (5, 4), (7, 4), (12, 8)])
def test_the_timed_tree_uses_the_same_depth_as_nccls_choice(nodes, same_as):
    """A non-power-of-two node count has the depth of the power of two below it (NCCL's floor), not above
    (the ceil(log2) that cost/collectives/comm.py used before, which disagreed with nccl_picks_tree)."""
    assert _tree_latency_s(nodes) == pytest.approx(_tree_latency_s(same_as), rel=1e-4)  # 1 byte: latency
    assert _tree_latency_s(2 * same_as) > _tree_latency_s(nodes)


def test_each_nccl_number_is_written_once():
    """The ratios the time model uses are derived from NCCL's tables, not restated."""
    for p in nccl_tuning.PROTOCOLS:
        assert nccl_tuning.TREE_VS_RING_NET_HOP[p] == nccl_tuning.NET_HOP_US["tree"][p] / nccl_tuning.NET_HOP_US["ring"][p]
        assert nccl_tuning.TREE_VS_RING_BANDWIDTH[p] == pytest.approx(
            nccl_tuning.TREE_PROTOCOL_BANDWIDTH[p] / nccl_tuning.RING_PROTOCOL_BANDWIDTH[p])
        assert nccl_tuning.NET_RING_HOP_LATENCY_S[p] == pytest.approx(nccl_tuning.NET_HOP_US["ring"][p] * 1e-6)
    source = "".join(open(m.__file__).read() for m in (comm, nccl_tuning))
    assert "math.log2" not in source and "ceil(" not in source  # no second rule for the depth
