"""MoE communication hidden behind compute: the EP all-to-all overlap and the shared-expert overlap.

**EP overlap** (``--overlap-moe-expert-parallel-comm``, with or without ``--delay-wgrad-compute``):
Megatron-Core's combined 1F1B (megatron/core/pipeline_parallel/combined_1f1b.py, models/common/
model_chunk_schedule_plan.py ``TransformerLayerSchedulePlan.run``, models/gpt/fine_grained_callables.py,
NVIDIA/Megatron-LM commit d98e8a64ddf3) runs the forward of one micro-batch together with the backward of
another, layer by layer, on a compute and a communication stream::

    comm stream: combine_bwd      | dispatch_fwd -> dispatch_bwd       | combine_fwd
    comp stream: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd  | pre_dispatch_bwd

pre_dispatch = attention, norms, router and the shared expert; mlp = the routed experts. Each stream runs in
order; the forward nodes depend on each other, so do the backward ones (one CUDA event per micro-batch); the
expert weight gradients (``mlp_bwd_dw``) run on the compute stream outside those events, so with delayed wgrad
the dispatch backward starts after the expert data gradients alone (``layer_pair_s``). The step a layer pair
saves over running both passes one after the other is the communication hidden; echo-tune takes it off the
pair's ``ep_comm`` (shared by the two passes as their EP communication) and adds the compute slowed beside it:
SM sharing by DeepEP / HybridEP (``cost/moe_dispatch.sm_slowdown``) or the profile's interference curve for
NCCL. The all-to-alls themselves run slower while compute runs beside them, by the profile's comm curve, as every
overlapped collective does in echo-tune (``_comm_slowdown``, ``slowed_hidden_s``; until 2026-12-05 they did not, and
the EP overlap of the all-to-all dispatcher on 16 H100 saved 35% of the step where Megatron-Bridge #3862 measured
24%). Assumptions: the expert weight gradients are half of the experts' backward GEMM time (one data- and one
weight-gradient GEMM of equal FLOPs per linear); the permute kernels stay on the compute stream
(Megatron runs them on the communication stream: conservative); a pass pairs with a layer of its own kind;
warm-up forwards and cool-down backwards run unpaired (``paired_fraction``).

**Shared-expert overlap** (``--moe-shared-expert-overlap``; megatron/core/transformer/moe/shared_experts.py):
the shared expert's fc1 and fc2 run on a side stream beside the dispatch and combine, forward and backward:
min(shared-expert time, dispatch + combine) is hidden in each pass, the all-to-alls slowed beside it by the profile's
comm curve (``_comm_slowdown``).
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass

from echo_tune.cost.collectives.moe_dispatch import sm_slowdown
from echo_tune.cost.collectives.tp_overlap import DEFAULT_SM_COUNT, slowdown
from echo_tune.sim.schedule.costing import ZERO, CostContext, PhaseCost, phase_cost
from echo_tune.workload.graph import Op, Trace

EXPERT_PARTS = ("dispatch", "experts", "combine")


@dataclass(frozen=True, kw_only=True)
class LayerParts:
    """One MoE layer, one micro-batch: the durations of the nodes of Megatron's layer schedule plan."""

    pre_fwd_s: float
    dispatch_fwd_s: float
    experts_fwd_s: float
    combine_fwd_s: float
    pre_bwd_s: float
    dispatch_bwd_s: float
    experts_dgrad_s: float
    experts_wgrad_s: float
    combine_bwd_s: float

    @property
    def serial_s(self) -> float:
        return (self.pre_fwd_s + self.dispatch_fwd_s + self.experts_fwd_s + self.combine_fwd_s + self.pre_bwd_s
                + self.dispatch_bwd_s + self.experts_dgrad_s + self.experts_wgrad_s + self.combine_bwd_s)

    @property
    def comm_s(self) -> float:
        return self.dispatch_fwd_s + self.combine_fwd_s + self.dispatch_bwd_s + self.combine_bwd_s


def layer_pair_s(parts: LayerParts, delay_wgrad_compute: bool) -> float:
    """Time of one forward layer and one backward layer run as Megatron's ``TransformerLayerSchedulePlan.run``
    schedules them on two in-order streams (see the module docstring)."""
    p = parts
    combine_b = p.combine_bwd_s                                  # comm, needs only the incoming gradient
    pre_f = p.pre_fwd_s                                          # comp
    dgrad = max(pre_f, combine_b) + p.experts_dgrad_s            # comp: mlp_bwd after the combine backward
    dispatch_f = max(combine_b, pre_f) + p.dispatch_fwd_s        # comm: after pre_dispatch_fwd
    wgrad = dgrad + p.experts_wgrad_s                            # comp: mlp_bwd_dw
    ready_b = dgrad if delay_wgrad_compute else wgrad            # without delay, wgrad is part of mlp_bwd
    dispatch_b = max(dispatch_f, ready_b) + p.dispatch_bwd_s     # comm
    experts_f = max(wgrad, dispatch_f) + p.experts_fwd_s         # comp: mlp_fwd
    combine_f = max(dispatch_b, experts_f) + p.combine_fwd_s     # comm
    pre_b = max(experts_f, dispatch_b) + p.pre_bwd_s             # comp: pre_dispatch_bwd
    return max(combine_f, pre_b)


def ep_overlap_hidden_s(parts: LayerParts, delay_wgrad_compute: bool, comm_slowdown: float = 1.0) -> float:
    """EP communication of one layer pair hidden behind the other micro-batch's compute: what the two-stream schedule
    hides (``layer_pair_s``), at most the pair's compute over ``comm_slowdown`` (``slowed_hidden_s``)."""
    hidden = max(0.0, parts.serial_s - layer_pair_s(parts, delay_wgrad_compute))
    return slowed_hidden_s(hidden, parts.serial_s - parts.comm_s, comm_slowdown)


def slowed_hidden_s(hidden_s: float, compute_s: float, comm_slowdown: float) -> float:
    """Communication hidden when it runs ``comm_slowdown`` (k) times slower while compute runs beside it (the profile's
    comm curve, as every collective echo-tune overlaps): ``hidden_s`` at full speed, but ``compute_s`` of compute
    beside it moves only compute_s / k of it; what no compute is beside runs at full speed, exposed. So a pair whose
    compute outlasts its slowed communication still hides all of it, and a communication-bound one hides 1 / k of
    the compute beside it, never less than nothing (a feature switched on is never slower for it)."""
    return min(hidden_s, compute_s / max(comm_slowdown, 1.0))


def shared_overlap_hidden_s(shared_s: float, ep_comm_s: float) -> float:
    """Shared-expert compute run beside the dispatch and combine of the same pass: the smaller is hidden."""
    return min(shared_s, ep_comm_s)


def shared_overlap_comm_change_s(shared_s: float, ep_comm_s: float, comm_slowdown: float = 1.0) -> float:
    """Change to a pass's exposed EP communication when its shared expert runs beside the dispatch and combine, the
    all-to-alls ``comm_slowdown`` times as slow beside it (``slowed_hidden_s``): -min(s / k, c)."""
    return -slowed_hidden_s(shared_overlap_hidden_s(shared_s, ep_comm_s), shared_s, comm_slowdown)


def compute_slowdown(kernel: str, size_bytes: float, profile, sm_count: int | None,
                     num_sms: int | None = None) -> float:
    """Compute slowdown beside the EP communication: the flex kernels' SMs (``num_sms``:
    ``--moe-flex-dispatcher-num-sms``), or the profile's curve for NCCL."""
    if kernel in ("deepep", "hybridep"):
        return sm_slowdown(kernel, sm_count or DEFAULT_SM_COUNT, num_sms)
    return slowdown(profile, "compute", size_bytes, "gemm")


def paired_fraction(schedule: str, stage: int, p: int, m: int, v: int) -> float:
    """Share of a stage's forward (and backward) passes that Megatron's combined 1F1B pairs: all but the
    warm-up forwards (and as many cool-down backwards) of its schedule (schedules.py); with no pipelining the
    first forward and the last backward run alone (combined_1f1b_schedule_for_no_pipelining)."""
    total = m * v
    if schedule == "interleaved":
        warmup = min((p - stage - 1) * 2 + (v - 1) * p, total)
    elif schedule == "1f1b":
        warmup = min(p - stage - 1, m)
    else:
        warmup = 0
    warmup = max(1, warmup)  # the first forward of a stage always runs alone
    return max(0, total - warmup) / total


def _part(op: Op) -> str:
    """The schedule-plan part of a MoE op: the experts' activation ("expert_act") is part of "experts", the flex
    dispatcher's metadata kernels ("dispatch_metadata") part of "dispatch"."""
    return {"expert_act": "experts", "dispatch_metadata": "dispatch"}.get(op.subregion, op.subregion)


def _parts(ops: tuple[Op, ...], ctx: CostContext) -> tuple[PhaseCost, dict[str, PhaseCost]]:
    """(everything outside the routed path, {dispatch, experts, combine}) of one pass of an MoE layer."""
    routed = {part: tuple(op for op in ops if op.region == "moe" and _part(op) == part) for part in EXPERT_PARTS}
    rest = tuple(op for op in ops if not (op.region == "moe" and _part(op) in EXPERT_PARTS))
    return phase_cost(rest, ctx), {part: phase_cost(o, ctx) for part, o in routed.items()}


def layer_parts(trace: Trace, ctx: CostContext) -> LayerParts:
    """The schedule-plan nodes of a traced MoE layer. The dispatch / combine nodes' own compute (permutation)
    is counted with the compute node next to it on the compute stream. GPU time only: the whole passes carry
    their wait on the host (cost/host/host_bound.py), not each node."""
    ctx = dataclasses.replace(ctx, host_bound=False)
    pre_f, fwd = _parts(trace.forward, ctx)
    pre_b, bwd = _parts(trace.backward, ctx)
    gemms = tuple(op for op in trace.backward if op.region == "moe" and op.subregion == "experts" and op.kind == "gemm")
    wgrad = 0.5 * phase_cost(gemms, ctx).compute_s

    def own(cost: PhaseCost) -> float:
        return cost.total_s - cost.ep_comm_s

    return LayerParts(pre_fwd_s=pre_f.total_s + own(fwd["dispatch"]), dispatch_fwd_s=fwd["dispatch"].ep_comm_s,
                      experts_fwd_s=fwd["experts"].total_s + own(fwd["combine"]),
                      combine_fwd_s=fwd["combine"].ep_comm_s,
                      pre_bwd_s=pre_b.total_s + own(bwd["dispatch"]), dispatch_bwd_s=bwd["dispatch"].ep_comm_s,
                      experts_dgrad_s=bwd["experts"].total_s + own(bwd["combine"]) - wgrad, experts_wgrad_s=wgrad,
                      combine_bwd_s=bwd["combine"].ep_comm_s)


def _comm_slowdown(trace: Trace, ctx: CostContext) -> float:
    """The EP all-to-alls' slowdown beside compute: the profile's comm curve at their message size (datasheet profiles:
    ``DATASHEET_COMM_SLOWDOWN``; ``echo-tune calibrate`` measures it), the same for NCCL and the flex kernels."""
    return slowdown(ctx.profile, "comm", _ep_message_bytes(trace), "gemm")


def _ep_message_bytes(trace: Trace) -> float:
    """The largest EP all-to-all message of the layer's forward (what the interference curves are read at)."""
    return max((op.size_bytes for op in trace.forward if op.kind == "collective" and op.group == "ep"), default=0)


def _slowdown(trace: Trace, ctx: CostContext) -> float:
    kernel = ctx.moe.dispatcher if ctx.moe is not None else "alltoall"
    return compute_slowdown(kernel, _ep_message_bytes(trace), ctx.profile, ctx.gpu.sm_count,
                            ctx.moe.num_sms if ctx.moe is not None else None)


def shared_overlap_costs(trace: Trace, ctx: CostContext, forward: PhaseCost,
                         backward: PhaseCost) -> tuple[PhaseCost, PhaseCost]:
    """The MoE layer's passes with the shared expert run beside their dispatch and combine."""
    factor, k = _slowdown(trace, ctx) - 1.0, _comm_slowdown(trace, ctx)
    out = []
    gpu_only = dataclasses.replace(ctx, host_bound=False)  # the shared expert's GPU time hides the EP comm
    for ops, cost in ((trace.forward, forward), (trace.backward, backward)):
        shared = phase_cost(tuple(op for op in ops if op.region == "moe" and op.subregion == "shared"), gpu_only)
        hidden = slowed_hidden_s(shared_overlap_hidden_s(shared.total_s, cost.ep_comm_s), shared.total_s, k)
        beside = min(shared.total_s, k * hidden)  # the shared expert's time beside the (slowed) all-to-alls
        out.append(cost + PhaseCost(ep_comm_s=-hidden, interference_s=beside * factor))
    return out[0], out[1]


def ep_overlap_deltas(trace: Trace, ctx: CostContext, delay_wgrad_compute: bool) -> tuple[PhaseCost, PhaseCost]:
    """Change to one MoE layer's forward and backward pass when the pair runs overlapped: the hidden
    communication leaves ``ep_comm`` (split between the passes by their EP communication) and the compute beside
    it is slowed."""
    parts = layer_parts(trace, ctx)
    if parts.comm_s <= 0:
        return ZERO, ZERO
    hidden = ep_overlap_hidden_s(parts, delay_wgrad_compute, comm_slowdown=_comm_slowdown(trace, ctx))
    fwd = hidden * (parts.dispatch_fwd_s + parts.combine_fwd_s) / parts.comm_s
    factor = _slowdown(trace, ctx) - 1.0
    return (PhaseCost(ep_comm_s=-fwd, interference_s=fwd * factor),
            PhaseCost(ep_comm_s=-(hidden - fwd), interference_s=(hidden - fwd) * factor))
