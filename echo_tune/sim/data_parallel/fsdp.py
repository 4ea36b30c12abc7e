"""Megatron-FSDP communication: per-unit parameter all-gathers and gradient reduce-scatters inside the
passes, and the step's tail (Megatron-LM d98e8a64ddf3, core/distributed/fsdp/src/megatron_fsdp/).

megatron_fsdp.py: with ``optim_grads_params`` a unit (a transformer layer or MoE layer,
``fsdp_unit_modules`` in mcore_fsdp_adapter.py) is all-gathered over DP x CP before its forward and
again before its backward (``_pre_forward_param_unshard`` / ``_pre_backward``), prefetching the next unit in
pass order (``all_gather_params(prefetch=True)``), and released after. Modules outside the units (embedding,
output layer, final norm: the root) stay unsharded once gathered ("Non-unit modules remain persistently
un-sharded", docs/user-guide/features/megatron_fsdp.md): one all-gather per step, here after the optimizer
step (it is the next step's first wait). Every unit's gradients (the root's too) are reduce-scattered
after its backward *in every micro-batch* (``grad_reduce_every_bprop`` for optim_grads and
optim_grads_params), on another stream. So in a pass the first unit's all-gather waits; each later unit's
all-gather (and, in backward, the previous unit's reduce-scatter) runs beside the current unit's compute,
exposed where it is longer (slowed where they overlap, ``costing._overlapped``); the last reduce-scatter of a
backward is exposed. At the end of the step the optimizer runs on the rank's shard and, with
optim_grads_params, no parameter all-gather follows. With HSDP (``--num-distributed-optimizer-instances``)
the shard is all-reduced across the outer group on the last micro-batch (``outer_fsdp_group_grad_reduce``),
and with ``--outer-dp-sharding-strategy optim`` the weights are all-gathered across it at the first
(``outer_fsdp_group_param_gather``). ``no_shard`` and ``optim`` keep whole parameters and gradients:
gradients reduce like DDP's (sim/data_parallel/dp.py), ``optim`` then shards the optimizer like the distributed optimizer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from echo_tune.config.specs.layout import GroupPlacement, Layout
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import ClusterProfile
from echo_tune.sim.schedule.costing import PhaseCost, _overlapped
from echo_tune.sim.data_parallel.dp import OPTIMIZER_BYTES_PER_PARAM, StageTail, ddp_bucket_params, stage_tail
from echo_tune.sim.data_parallel.dp_instances import instance_groups
from echo_tune.sim.memory.fsdp_memory import fsdp_buffer_bytes, fsdp_bytes, fsdp_stage_bytes

PIPELINE_UNIT_FLOOR = 1_000_000_000
"""megatron_fsdp.py: without --suggested-communication-unit-size the pipelines' size is at least 1e9 elements."""
PER_UNIT = ("optim_grads", "optim_grads_params")
"""Strategies whose gradients are reduce-scattered unit by unit in every backward."""


@dataclass(frozen=True, kw_only=True)
class Unit:
    """One FSDP unit in one pass: its all-gather, its reduce-scatter (backward) and its compute."""
    gather_s: float = 0.0
    reduce_s: float = 0.0
    compute_s: float = 0.0
    gather_bytes: float = 0.0


def dp_cp_group(layout: Layout) -> GroupPlacement:
    """The DP x CP group Megatron-FSDP shards over (CP ranks inside the DP stride, both contiguous)."""
    dp, cp = layout.groups["dp"], layout.groups["cp"]
    if cp.size == 1:
        return dp
    size, per_node = dp.size * cp.size, dp.ranks_per_node * cp.ranks_per_node
    return dataclasses.replace(dp, size=size, ranks_per_node=per_node, num_nodes=-(-size // per_node))


def shard_groups(layout: Layout, parallel: ParallelConfig) -> tuple[GroupPlacement, GroupPlacement | None]:
    """(shard group, HSDP outer group or None)."""
    group, n = dp_cp_group(layout), parallel.num_distributed_optimizer_instances
    if n == 1:
        return group, None
    return instance_groups(group, n)


def unit_comm_s(parallel: ParallelConfig, dense_params: float, expert_params: float, shard: GroupPlacement,
                edp: GroupPlacement | None, profile: ClusterProfile) -> tuple[float, float, float]:
    """(all-gather s, reduce-scatter s, all-gather bytes) of one unit: its dense parameters over the shard
    group, its routed experts' over the expert-data-parallel group (one after the other, one stream)."""
    b, strategy = fsdp_bytes(parallel), parallel.data_parallel_sharding_strategy
    gather = reduce = 0.0
    for params, group in ((dense_params, shard), (expert_params, edp)):
        if params and group is not None:
            if strategy == "optim_grads_params":
                gather += collective_time_s("all_gather", params * b.gather, group, profile)
            if strategy in PER_UNIT:
                reduce += collective_time_s("reduce_scatter", params * b.grad_comm, group, profile)
    return gather, reduce, (dense_params + expert_params) * b.gather


def pass_cost(units: list[Unit], profile: ClusterProfile, backward: bool) -> PhaseCost:
    """Exposed FSDP communication (``dp_comm_s``) and interference of one pass over ``units`` in order.

    The first unit's all-gather is exposed; beside unit i's compute run unit i+1's all-gather (prefetch) and,
    in backward, unit i-1's reduce-scatter; the last unit's reduce-scatter is exposed."""
    if not units:
        return PhaseCost()
    exposed, interference = units[0].gather_s, 0.0
    for i, unit in enumerate(units):
        nxt = units[i + 1] if i + 1 < len(units) else None
        comm = (nxt.gather_s if nxt else 0.0) + (units[i - 1].reduce_s if backward and i > 0 else 0.0)
        if comm > 0:
            part = _overlapped(comm, unit.compute_s, profile, nxt.gather_bytes if nxt else 0.0, kind="gemm")
            exposed, interference = exposed + part.comm_exposed_s, interference + part.interference_s
    if backward:
        exposed += units[-1].reduce_s
    return PhaseCost(dp_comm_s=exposed, interference_s=interference)


def fsdp_stage_tail(*, parallel: ParallelConfig, dp: GroupPlacement, profile: ClusterProfile,
                    chunk_params: list[int], chunk_backward, compute_end_s: float, embedding_sync_s: float = 0.0,
                    expert_chunk_params: list[int] | None = None, edp: GroupPlacement | None = None,
                    spans: list | None = None, root_params: int = 0) -> StageTail:
    """The step's tail on one stage under Megatron-FSDP; ``dp`` is the DP x CP group (``dp_cp_group``);
    ``root_params``: the stage's parameters outside the FSDP units (``fsdp_root_params``)."""
    strategy = parallel.data_parallel_sharding_strategy
    b = fsdp_bytes(parallel)
    if strategy not in PER_UNIT:  # whole gradients, reduced after the backward as DDP's buckets
        ddp = parallel.replace(use_distributed_optimizer=strategy == "optim",
                               grad_reduce_in_bf16=parallel.precision == "bf16" and b.grad_comm == 2.0)
        return stage_tail(parallel=ddp, dp=dp, profile=profile, chunk_params=chunk_params,
                          chunk_backward=chunk_backward, compute_end_s=compute_end_s,
                          embedding_sync_s=embedding_sync_s, expert_chunk_params=expert_chunk_params, edp=edp,
                          spans=spans)
    experts = sum(expert_chunk_params or []) if edp is not None else 0
    dense = sum(chunk_params) - experts
    n = parallel.num_distributed_optimizer_instances
    shard, outer = instance_groups(dp, n) if n > 1 else (dp, None)
    outer_optim = outer is not None and parallel.outer_dp_sharding_strategy == "optim"
    exposed = embedding_sync_s
    if outer is not None:  # HSDP: the gradient shard all-reduced (or reduce-scattered) across the replicas
        exposed += collective_time_s("reduce_scatter" if outer_optim else "all_reduce",
                                     dense / shard.size * b.grad_comm, outer, profile)
    owned = dense / (dp.size if outer_optim else shard.size) + (experts / edp.size if experts else 0.0)
    optimizer = owned * OPTIMIZER_BYTES_PER_PARAM / (profile.memory_bandwidth_gbyte_s * 1e9)
    if outer_optim:  # the updated weights all-gathered across the outer group before the next forward
        optimizer += collective_time_s("all_gather", dense / shard.size * b.gather, outer, profile)
    if strategy == "optim_grads_params":  # the root's updated weights, gathered once for the next step
        optimizer += collective_time_s("all_gather", root_params * b.gather, shard, profile)
    if strategy == "optim_grads":  # replicated weights: all-gather the updated shard (first bucket if overlapped)
        gathered = min(dense, ddp_bucket_params(dp.size)) if parallel.overlap_param_gather else dense
        optimizer += collective_time_s("all_gather", gathered * b.gather, shard, profile)
        if experts and not parallel.overlap_param_gather:
            optimizer += collective_time_s("all_gather", experts * b.gather, edp, profile)
    return StageTail(dp_exposed_s=exposed, interference_s=0.0, optimizer_s=optimizer)


def fsdp_root_params(layout: Layout, pieces, stage: int, chunk: int | None = None) -> int:
    """Parameters outside the FSDP units (the root module) on a stage's chunk (or the whole stage): embedding,
    output layer (the tied word embedding counted once) and final norm (in the output piece)."""
    chunks = range(len(layout.chunk_contents[stage])) if chunk is None else (chunk,)
    shared = pieces["output"].tied_param_count if layout.holder("embedding")[0] == layout.holder("loss")[0] else 0
    params = 0
    for c in chunks:
        contents = layout.chunk_contents[stage][c]
        params += pieces["embedding"].param_count if contents.embedding else 0
        params += pieces["output"].param_count - shared if contents.loss else 0
    return params


def with_fsdp_comm(passes, layout: Layout, parallel: ParallelConfig, pieces, costs, mix,
                   profile: ClusterProfile):
    """``passes[s][c]`` = (fwd, bwd, recompute) with each pass's exposed FSDP communication added
    (``pass_cost``; only optim_grads and optim_grads_params communicate inside the passes)."""
    if parallel.data_parallel_sharding_strategy not in PER_UNIT:
        return passes
    shard, edp = shard_groups(layout, parallel)[0], layout.groups["edp"]
    dense = unit_comm_s(parallel, pieces["layer"].param_count, 0, shard, None, profile)
    moe = pieces.get("moe_layer")
    routed = unit_comm_s(parallel, moe.param_count - moe.expert_param_count, moe.expert_param_count, shard, edp,
                         profile) if moe else dense
    out = []
    for s, row in enumerate(passes):
        new_row = []
        for c, (fwd, bwd, rec) in enumerate(row):
            contents = layout.chunk_contents[s][c]
            n_dense, n_moe = mix[s][c] or (contents.layers + contents.mtp_layers, 0)
            rec_s = rec.total_s / (n_dense + n_moe) if n_dense + n_moe else 0.0
            fwd_units, bwd_units = [], []
            root = fsdp_root_params(layout, pieces, s, c)
            if root:  # gathered once per step (fsdp_stage_tail); its gradients reduce-scattered every backward
                reduce = unit_comm_s(parallel, root, 0, shard, None, profile)[1]
                fwd_units.append(Unit(compute_s=costs.embedding_forward.total_s))
                bwd_units.append(Unit(reduce_s=reduce, compute_s=costs.output_backward.total_s))
            for count, (gather, reduce, size), f_s, b_s in (
                    (n_dense, dense, costs.layer_forward.total_s, costs.layer_backward.total_s),
                    (n_moe, routed, costs.moe_layer_forward.total_s, costs.moe_layer_backward.total_s)):
                fwd_units += [Unit(gather_s=gather, compute_s=f_s, gather_bytes=size)] * count
                bwd_units += [Unit(gather_s=gather, reduce_s=reduce, compute_s=b_s + rec_s, gather_bytes=size)] * count
            new_row.append((fwd + pass_cost(fwd_units, profile, False), bwd + pass_cost(bwd_units, profile, True),
                            rec))
        out.append(new_row)
    return out


def fsdp_memory_bytes(layout: Layout, parallel: ParallelConfig, pieces, stage: int, params: int,
                      expert_params: int) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, working buffers) bytes of one rank of ``stage`` (sim/memory/fsdp_memory.py)."""
    shard, outer = shard_groups(layout, parallel)
    optim_shard = dp_cp_group(layout).size if outer is not None and parallel.outer_dp_sharding_strategy == "optim" \
        else shard.size
    unit = max(pieces["moe_layer"].param_count if "moe_layer" in pieces else 0, pieces["layer"].param_count)
    weights, grads, optimizer, buffers = fsdp_stage_bytes(
        parallel, params=params, expert_params=expert_params, unit_params=unit if any(
            layout.stage_chunk_layers[stage]) else 0, dense_shard=shard.size, optim_shard=optim_shard,
        expert_shard=layout.groups["edp"].size)
    if parallel.data_parallel_sharding_strategy == "optim_grads_params":  # the root stays unsharded
        weights += fsdp_root_params(layout, pieces, stage) * fsdp_bytes(parallel).param * (1 - 1 / shard.size)
    return weights, grads, optimizer, buffers


def fsdp_notes(parallel: ParallelConfig, layout: Layout, memory) -> tuple[str, ...]:
    """The report's line on Megatron-FSDP: its strategy, shard group and working buffers."""
    if not parallel.use_megatron_fsdp:
        return ()
    shard, outer = shard_groups(layout, parallel)
    hsdp = f" (HSDP: {outer.size} replicas, outer {parallel.outer_dp_sharding_strategy})" if outer else ""
    buffers = max(m.fsdp_buffer_bytes for m in memory)
    which = ("Torch-FSDP2 (simulated as Megatron-FSDP's per-layer ZeRO-3)" if parallel.use_torch_fsdp2
             else "Megatron-FSDP")
    notes = (f"{which} {parallel.data_parallel_sharding_strategy} over DP x CP = {shard.size}{hsdp}: exposed "
             f"all-gathers / reduce-scatters in dp_comm; unsharded layer buffers {buffers / 2**30:.2f} GiB per GPU "
             f"(in the memory total)",)
    size = parallel.suggested_communication_unit_size or PIPELINE_UNIT_FLOOR
    per_unit_param = fsdp_buffer_bytes(parallel, 1.0)  # the buffers' bytes per unit parameter
    unit = buffers / per_unit_param if per_unit_param else 0.0
    if unit and unit < size / 2:
        notes += (f"Megatron-FSDP prefetches up to {size // 2:,} elements (suggested_communication_unit_size / 2), "
                  f"{size / 2 / unit:.1f} units of ~{unit:,.0f}; modelled with one unit ahead, so the exposed "
                  f"all-gather time is an upper bound",)
    return notes
