"""``step_memory``: a step's memory without its timing, the same numbers ``simulate`` reports.

The memory of a step depends on what each rank holds (weights, gradients, optimizer states, the activations the
schedule keeps in flight, workspaces, the runtime's reserve), not on how long its passes take, except where
fine-grained activation offloading drains activations to the host while a forward runs: there it needs the
passes' times, and ``step_memory`` returns None. A search uses it to set aside a layout that cannot fit before
simulating its step (``search/space/dominance.py``, "Over memory beyond the band").
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.profile import ClusterProfile
from echo_tune.sim.features.deferred_wgrad import deferred_wgrad
from echo_tune.sim.memory.stage import StageMemory
from echo_tune.sim.schedule.layer_mix import chunk_layer_mix
from echo_tune.sim.schedule.linear_layers import chunk_linear_mix
from echo_tune.sim.schedule.passes import trace_pieces
from echo_tune.sim.step_setup import (chunk_param_counts, cost_context, derived_sizes, mtp_layer_params, prepared,
                                      stage_memories)


@dataclass(frozen=True, kw_only=True)
class StepMemory:
    stage_memory: tuple[StageMemory, ...]
    """Per pipeline stage, as ``StepReport.stage_memory``."""
    peak_memory_bytes: int
    """The most loaded rank of the most loaded stage."""
    memory_capacity_bytes: int
    """The GPU's memory less the headroom asked for."""
    derived: dict
    """``simulate``'s derived sizes (data-parallel size, micro-batches, schedule, settings in effect)."""

    @property
    def fits_memory(self) -> bool:
        return self.peak_memory_bytes <= self.memory_capacity_bytes

    @property
    def memory_overshoot_bytes(self) -> int:
        return max(0, self.peak_memory_bytes - self.memory_capacity_bytes)

    @property
    def worst_stage(self) -> StageMemory:
        return max(self.stage_memory, key=lambda m: m.worst_rank_bytes)


def step_memory(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, parallel: ParallelConfig, *,
                profile: ClusterProfile | None = None, memory_headroom_bytes: int = 0,
                layout: Layout | None = None) -> StepMemory | None:
    """The memory ``simulate`` reports for this step (the same arguments), or None where it needs the passes'
    times (``--fine-grained-activation-offloading``). Raises ConfigError for a layout that breaks a rule."""
    parallel, layout, profile, cluster, schedule = prepared(model, cluster, num_gpus, parallel, profile, None, layout)
    if parallel.fine_grained_activation_offloading:
        return None
    pieces = trace_pieces(model, parallel, layout)
    mix, linears = chunk_layer_mix(model, layout), chunk_linear_mix(model, layout)
    counts = chunk_param_counts(layout, pieces, mix, mtp_layer_params(model, parallel), linears)
    defer = deferred_wgrad(pieces["output"], cost_context(model, cluster, parallel, layout, profile),
                           layout.num_micro_batches, parallel.wgrad_deferral_limit) \
        if parallel.defer_embedding_wgrad_compute else None
    drained = [[0.0] * len(row) for row in mix]  # without fine-grained offloading nothing is drained
    memory = stage_memories(model, cluster, parallel, layout, pieces, schedule, mix, linears,
                            [sum(params) for params, _ in counts], [sum(experts) for _, experts in counts],
                            drained, defer)
    return StepMemory(stage_memory=memory, peak_memory_bytes=max(m.worst_rank_bytes for m in memory),
                      memory_capacity_bytes=cluster.gpu.memory_bytes - memory_headroom_bytes,
                      derived=derived_sizes(layout, schedule))
