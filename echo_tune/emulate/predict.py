"""The simulator's view of one stage: its parts, and when its neighbours' tasks end (the p2p waits).

Everything comes from ``simulate`` itself (its timeline, with ``timeline=True``) and from the same
pass costs (``sim.passes.pass_costs``, ``sim.chunk_passes.chunk_passes``), so emulate compares against exactly
what ``simulate`` reports. "compute" includes recompute (``simulate`` reports it as its own part). The cost
context is ``simulate``'s (its MoE kernels and EP settings), the chunks' dense / MoE layer mix its
``chunk_layer_mix``; "ep_comm" is its dispatch / combine time, "experts" the routed experts' compute (the
"moe/experts" and "moe/expert_act" sub-regions of the traced MoE layer, through the same ``chunk_passes``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.rules.compatibility import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.profile import ClusterProfile
from echo_tune.sim.schedule.costing import ZERO, CostContext, PhaseCost, phase_cost
from echo_tune.sim.schedule.layer_mix import chunk_layer_mix
from echo_tune.sim.schedule.passes import PassCosts, pass_costs, trace_pieces
from echo_tune.sim.outputs.report import StepReport
from echo_tune.sim.schedule.chunk_passes import chunk_passes
from echo_tune.sim.features.determinism import ring_only_profile
from echo_tune.sim.simulate import p2p_time_s, simulate
from echo_tune.sim.step_setup import cost_context, with_sustained_clock

_TASK = re.compile(r"^([FB])(\d+)(?:\.(\d+))?$")

TaskKey = tuple[int, bool, int, int]
"""(stage, is_backward, micro_batch, chunk)."""


@dataclass(frozen=True, kw_only=True)
class StagePrediction:
    stage: int
    report: StepReport
    task_end_s: dict[TaskKey, float]
    """Simulated end of every task of every stage."""
    p2p_s: float
    """Simulated time of one p2p transfer between neighbouring stages."""
    forward: list[PhaseCost]
    """Per chunk: one micro-batch's forward pass on this stage."""
    backward: list[PhaseCost]
    """Per chunk: one micro-batch's backward pass, with its recompute (full or selective)."""
    pipeline_end_s: float
    """End of the stage's last task."""
    tail_s: float
    """After it: exposed DP communication, its interference and the optimizer step."""
    experts: list[PhaseCost] | None = None
    """Per chunk: the routed experts' share of one micro-batch's passes (recompute included); None: no MoE."""

    def parts(self, num_micro_batches: int) -> dict[str, float]:
        """The stage's step as parts, named as ``emulate`` reports them."""
        total = sum(self.forward + self.backward, ZERO).scaled(num_micro_batches)
        busy = total.total_s
        parts = {"compute": total.compute_s, "tp_cp_comm": total.comm_exposed_s,
                 "interference": total.interference_s,
                 # a residue of the subtraction (5e-17 s at PP 1) is no wait
                 "pp_wait": 0.0 if self.pipeline_end_s - busy <= 1e-9 * self.pipeline_end_s
                 else self.pipeline_end_s - busy,
                 "pipeline": self.pipeline_end_s, "tail": self.tail_s, "stage_step": self.pipeline_end_s + self.tail_s}
        if self.experts is not None:
            parts.update(ep_comm=total.ep_comm_s,
                         experts=sum(self.experts, ZERO).scaled(num_micro_batches).compute_s)
        return parts


def task_end_times(report: StepReport) -> dict[TaskKey, float]:
    """(stage, is_backward, micro_batch, chunk) -> end, from a simulate(..., timeline=True) report."""
    ends: dict[TaskKey, float] = {}
    for stage, name, category, _start, end in report.timeline:
        match = _TASK.match(name)
        if match and category in ("forward", "backward"):
            ends[(stage, match[1] == "B", int(match[2]), int(match[3] or 0))] = end
    return ends


def predict_stage(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, parallel: ParallelConfig, layout: Layout,
                  profile: ClusterProfile, stage: int) -> StagePrediction:
    report = simulate(model, cluster, num_gpus, parallel, profile=profile, timeline=True)
    pieces = trace_pieces(model, parallel, layout)
    profile = ring_only_profile(profile, parallel)  # the profile and clock simulate costs with
    ctx = cost_context(model, with_sustained_clock(cluster, profile), parallel, layout, profile)
    costs = pass_costs(pieces, ctx, layout.recompute_regions)  # simulate's context and recompute regions
    mix = chunk_layer_mix(model, layout)[stage]
    chunks = range(layout.virtual_pipeline_size)
    passes = [chunk_passes(layout, costs, stage, c, mix[c]) for c in chunks]
    experts = None
    if "moe_layer" in pieces:
        only = expert_costs(pieces["moe_layer"], ctx)
        experts = [sum(chunk_passes(layout, only, stage, c, mix[c]), ZERO) for c in chunks]
    forward = [f for f, _, _ in passes]
    backward = [b + r for _, b, r in passes]  # recompute runs inside the backward pass
    ends = task_end_times(report)
    pipeline_end = max(end for (s, *_), end in ends.items() if s == stage)
    stage_end = max(end for s, *_, end in report.timeline if s == stage)
    return StagePrediction(stage=stage, report=report, task_end_s=ends, p2p_s=p2p_time_s(pieces, layout, profile),
                           forward=forward, backward=backward, pipeline_end_s=pipeline_end,
                           tail_s=stage_end - pipeline_end, experts=experts)


def expert_costs(moe_layer, ctx: CostContext) -> PassCosts:
    """Pass costs with only the routed experts of each MoE layer (their GEMMs and activation): what
    ``chunk_passes`` then counts per chunk, recompute included."""
    def cost(ops) -> PhaseCost:
        return sum((phase_cost(ops, ctx, region=r, piece="moe_layer") for r in ("moe/experts", "moe/expert_act")),
                   ZERO)

    return PassCosts(layer_forward=ZERO, layer_backward=ZERO, selective_recompute=ZERO, embedding_forward=ZERO,
                     embedding_backward=ZERO, output_forward=ZERO, output_backward=ZERO,
                     moe_layer_forward=cost(moe_layer.forward), moe_layer_backward=cost(moe_layer.backward))
