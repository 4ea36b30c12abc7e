"""DeepEP / HybridEP dispatch: de-duplicated node and rank counts, README bandwidths, SMs (hand-worked)."""

from __future__ import annotations

import math

import pytest

from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.cost.collectives.moe_dispatch import (MoEKernels, expected_units_reached, flex_dispatch_time_s, sm_slowdown)
from echo_tune.errors import ConfigError
from echo_tune.workload.graph import Op


def _miss(pool: int, away: int, k: int) -> float:
    """P(none of k experts drawn without replacement from ``pool`` lands in a block of ``pool - away``)."""
    return math.prod((away - i) / (pool - i) for i in range(k))


def test_plain_top_k_units_reached():
    # 8 experts on 2 ranks (4 each), top-2: a rank is missed when both experts are on the other one:
    # C(4,2)/C(8,2) = 6/28, so 2 x (1 - 6/28) = 11/7 ranks on average
    assert expected_units_reached(8, 2, 2) == pytest.approx(11 / 7)
    # top-1 always reaches exactly one rank; top-k with one rank per expert reaches k ranks
    assert expected_units_reached(64, 1, 8) == pytest.approx(1.0)
    assert expected_units_reached(16, 4, 16) == pytest.approx(4.0)


def test_group_limited_routing_bounds_the_nodes_a_token_reaches():
    # DeepSeek-V3: 256 experts top-8 on 8 nodes (32 experts each = one routing group each), 4 of 8 groups:
    # a node is missed when its group is not chosen (1/2) or chosen but none of the 8 experts drawn from the
    # 4 chosen groups' 128 lands on its 32: 1/2 x (96/128 x 95/127 x ... x 89/121)
    limited = 8 * (1 - (0.5 + 0.5 * _miss(128, 96, 8)))
    assert expected_units_reached(256, 8, 8, num_groups=8, group_topk=4) == pytest.approx(limited)
    assert limited == pytest.approx(3.629, abs=1e-3) and limited <= 4
    plain = 8 * (1 - _miss(256, 224, 8))  # without group limits: ~5.29 of 8 nodes
    assert expected_units_reached(256, 8, 8) == pytest.approx(plain)
    # one group per node, one group per token: every copy lands on one node
    assert expected_units_reached(8, 2, 2, num_groups=2, group_topk=1) == pytest.approx(1.0)


def test_units_must_split_the_experts():
    with pytest.raises(ConfigError, match="num_experts % units"):
        expected_units_reached(10, 2, 4)


def test_deepep_internode_dispatch_from_the_readme_rdma_bandwidth():
    # 4096 tokens x hidden 7168 in bf16 = 58,720,256 bytes of tokens; top-8 copies are 8x that
    token_bytes = 4096 * 7168 * 2
    ep64 = GroupPlacement(size=64, ranks_per_node=8, num_nodes=8)
    t = flex_dispatch_time_s("deepep", "dispatch", 8 * token_bytes, 8, ep64, 256, num_groups=8, group_topk=4,
                             nvlink_gbyte_s=450, nic_gbyte_s=50)
    nodes = 8 * (1 - (0.5 + 0.5 * _miss(128, 96, 8)))          # 3.629 nodes, 7/8 of them remote
    rdma_s = token_bytes * nodes * 7 / 8 / 51e9                  # DeepEP README EP64 dispatch: 51 GB/s
    ranks = 64 * (1 - (0.5 + 0.5 * _miss(128, 124, 8)))          # ranks: 4 experts each (the NVLink side)
    nvlink_s = token_bytes * ranks * 7 / 8 / 153e9
    assert t == pytest.approx(max(rdma_s, nvlink_s)) and rdma_s > nvlink_s
    assert t == pytest.approx(3.65e-3, rel=0.01)
    # combine at EP64: 50 GB/s; with twice the NIC bandwidth the RDMA side halves and NVLink (158 GB/s) binds
    c = flex_dispatch_time_s("deepep", "combine", 8 * token_bytes, 8, ep64, 256, num_groups=8, group_topk=4,
                             nvlink_gbyte_s=450, nic_gbyte_s=100)
    rdma_c, nvlink_c = token_bytes * nodes * 7 / 8 / (50e9 * 2), token_bytes * ranks * 7 / 8 / 158e9
    assert c == pytest.approx(nvlink_c) and nvlink_c > rdma_c


def test_deepep_intranode_and_hybridep_rows():
    token_bytes = 2048 * 4096 * 2
    ep8 = GroupPlacement(size=8, ranks_per_node=8, num_nodes=1)
    t = flex_dispatch_time_s("deepep", "dispatch", 8 * token_bytes, 8, ep8, 128, nvlink_gbyte_s=450, nic_gbyte_s=50)
    ranks = 8 * (1 - _miss(128, 112, 8))                          # 16 experts per rank
    assert t == pytest.approx(token_bytes * ranks * 7 / 8 / 153e9)
    # a slower NVLink than the README's H800 caps it
    slow = flex_dispatch_time_s("deepep", "dispatch", 8 * token_bytes, 8, ep8, 128, nvlink_gbyte_s=100,
                                nic_gbyte_s=50)
    assert slow == pytest.approx(token_bytes * ranks * 7 / 8 / 100e9)
    # HybridEP README, H100, 32 ranks, 16 SMs: BF16 dispatch 47.36 GB/s (EP 48 takes the EP 32 row)
    ep48 = GroupPlacement(size=48, ranks_per_node=8, num_nodes=6)
    h = flex_dispatch_time_s("hybridep", "dispatch", 8 * token_bytes, 8, ep48, 96, nvlink_gbyte_s=450, nic_gbyte_s=50)
    nodes = 6 * (1 - _miss(96, 80, 8))
    assert h == pytest.approx(token_bytes * nodes * 5 / 6 / 47.36e9)


def test_kernel_directions_and_sms():
    kernels = MoEKernels(dispatcher="deepep", num_experts=8, topk=2, nvlink_gbyte_s=450, nic_gbyte_s=50)
    ep = GroupPlacement(size=2, ranks_per_node=1, num_nodes=2)
    size = 1 << 26

    def a2a(subregion, phase):
        return kernels.all_to_all_s(Op(name="all_to_all", kind="collective", phase=phase, region="moe",
                                       subregion=subregion, collective="all_to_all", group="ep"), size, ep)
    # forward dispatch and backward of the combine run the dispatch kernel (43 GB/s below EP 16), the others
    # the combine kernel (43 GB/s as well at EP 16: equal here), each 11/7 x 1/2 of a token set away
    assert a2a("dispatch", "fwd") == pytest.approx(size / 2 * 11 / 7 / 2 / 43e9)
    assert a2a("combine", "bwd") == a2a("dispatch", "fwd") == a2a("combine", "fwd")
    assert sm_slowdown("deepep", 132) == pytest.approx(132 / 112)   # 20 SMs of an H100's 132
    assert sm_slowdown("hybridep", 132) == pytest.approx(132 / 116)
