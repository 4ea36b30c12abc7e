"""Partial distributed optimizer (``--num-distributed-optimizer-instances N``).

Megatron-LM d98e8a64ddf3: core/parallel_state.py splits each DP x CP group into N *intra-instance* groups of
DP x CP / N consecutive ranks (``ranks_with_cp[i * size : (i + 1) * size]``) and N-rank *inter-instance*
groups across them; core/distributed/param_and_grad_buffer.py then reduce-scatters each gradient bucket over
the intra-instance group and all-reduces the resulting shard (bucket / intra size) over the inter-instance
group; the optimizer states are sharded over the intra-instance group only (N copies of the sharded state),
and the updated parameters are all-gathered over it.
"""

from __future__ import annotations

import dataclasses

from echo_tune.config.specs.layout import GroupPlacement
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import ClusterProfile


def instance_groups(dp: GroupPlacement, instances: int) -> tuple[GroupPlacement, GroupPlacement]:
    """(intra-instance, inter-instance) placements of a DP group split into ``instances`` instances.

    The intra group is ``dp.size / instances`` consecutive DP ranks: it fills a node's share of the DP group
    before crossing to the next node. The inter group takes one rank of each instance (stride = intra size),
    so its members share a node only when several instances fit in the node's share."""
    intra_size = max(1, dp.size // instances)  # CP ranks share the instances too: DP x CP / N >= 1
    intra_per_node = min(dp.ranks_per_node, intra_size)
    intra = dataclasses.replace(dp, size=intra_size, ranks_per_node=intra_per_node,
                                num_nodes=-(-intra_size // intra_per_node))
    inter_per_node = max(1, dp.ranks_per_node // intra_size)
    inter = dataclasses.replace(dp, size=instances, ranks_per_node=min(inter_per_node, instances),
                                num_nodes=-(-instances // min(inter_per_node, instances)))
    return intra, inter


def gradient_reduction_s(collective: str, size_bytes: float, dp: GroupPlacement, instances: int,
                         profile: ClusterProfile) -> float:
    """One bucket's reduction: over the whole DP group, or with instances (distributed optimizer) a
    reduce-scatter inside the instance plus an all-reduce of the shard across instances."""
    if instances == 1 or collective != "reduce_scatter":
        return collective_time_s(collective, size_bytes, dp, profile)
    intra, inter = instance_groups(dp, instances)
    return (collective_time_s("reduce_scatter", size_bytes, intra, profile)
            + collective_time_s("all_reduce", size_bytes / intra.size, inter, profile))
