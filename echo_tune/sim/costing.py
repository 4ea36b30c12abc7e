"""Turn traced pieces into timed pieces: compute, exposed TP/CP communication, interference.

Inside a layer, Megatron's TP (and SP) collectives sit on the critical path: the next GEMM needs
their result. With ``tp_comm_overlap`` they are split and run beside the GEMMs that produce or
consume them; CP ring-attention exchanges run beside the attention kernel. Where communication
overlaps compute, the compute is slowed by the profile's ``compute_slowdown`` (Echo's third idea)
and the communication by ``comm_slowdown``.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.cluster import GPUSpec
from echo_tune.config.compatibility import GroupPlacement
from echo_tune.cost.comm import collective_time_s
from echo_tune.cost.compute import op_time_s
from echo_tune.cost.profile import CalibrationProfile
from echo_tune.workload.graph import Op


@dataclass(frozen=True, kw_only=True)
class PhaseCost:
    """Time of one pass (forward or backward) of one piece for one micro-batch, by part."""

    compute_s: float = 0.0
    comm_exposed_s: float = 0.0
    interference_s: float = 0.0
    ep_comm_s: float = 0.0
    """MoE dispatch / combine (all-to-all or all-gather over the expert groups), never overlapped."""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_exposed_s + self.interference_s + self.ep_comm_s

    def __add__(self, other: "PhaseCost") -> "PhaseCost":
        return PhaseCost(compute_s=self.compute_s + other.compute_s,
                         comm_exposed_s=self.comm_exposed_s + other.comm_exposed_s,
                         interference_s=self.interference_s + other.interference_s,
                         ep_comm_s=self.ep_comm_s + other.ep_comm_s)

    def scaled(self, factor: float) -> "PhaseCost":
        return PhaseCost(compute_s=self.compute_s * factor, comm_exposed_s=self.comm_exposed_s * factor,
                         interference_s=self.interference_s * factor, ep_comm_s=self.ep_comm_s * factor)


ZERO = PhaseCost()
EXPERT_GROUPS = ("ep", "etp", "tpep")


@dataclass(frozen=True, kw_only=True)
class CostContext:
    profile: CalibrationProfile
    gpu: GPUSpec
    precision: str
    groups: dict[str, GroupPlacement]
    tp_comm_overlap: bool = False


def _overlapped(comm_s: float, hidden_by_s: float, profile: CalibrationProfile) -> PhaseCost:
    """Communication of ``comm_s`` run beside compute of ``hidden_by_s`` (already counted as compute)."""
    comm_s *= profile.comm_slowdown
    overlap_s = min(comm_s, hidden_by_s)
    return PhaseCost(comm_exposed_s=comm_s - overlap_s,
                     interference_s=overlap_s * (profile.compute_slowdown - 1.0))


def phase_cost(ops: tuple[Op, ...], ctx: CostContext, *, region: str | None = None) -> PhaseCost:
    """Cost of a list of ops (optionally only those of one region) on one rank."""
    compute_s = gemm_s = attention_s = 0.0
    tp_comm_s = cp_comm_s = ep_comm_s = 0.0
    for op in ops:
        if region is not None and op.region != region:
            continue
        if op.kind == "collective":
            t = collective_time_s(op.collective, op.size_bytes, ctx.groups[op.group], ctx.profile)
            if op.group == "cp":
                cp_comm_s += t
            elif op.group in EXPERT_GROUPS:  # MoE dispatch / combine: on the critical path, not overlapped
                ep_comm_s += t
            else:
                tp_comm_s += t
            continue
        t = op_time_s(op, ctx.profile, ctx.gpu, ctx.precision)
        compute_s += t
        if op.kind == "gemm":
            gemm_s += t
        elif op.kind == "attention":
            attention_s += t
    cost = PhaseCost(compute_s=compute_s, ep_comm_s=ep_comm_s) + _overlapped(cp_comm_s, attention_s, ctx.profile)
    if ctx.tp_comm_overlap:
        return cost + _overlapped(tp_comm_s, gemm_s, ctx.profile)
    return cost + PhaseCost(comm_exposed_s=tp_comm_s)
