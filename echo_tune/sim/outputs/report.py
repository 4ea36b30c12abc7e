"""The step report: step time as a sum of named parts, throughput, MFU and memory per stage."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from echo_tune.sim.memory.stage import StageMemory
from echo_tune.sim.memory.memory_band import MemoryBand, memory_band

# The named parts of a step, in the order reports print them. Their sum is the step time.
BREAKDOWN_PARTS = (
    "compute",        # forward + backward kernels (incl. embedding, loss, launch overhead)
    "recompute",      # forward passes replayed in backward (full or selective recompute)
    "tp_cp_comm",     # TP/SP and CP collectives left exposed on the critical path
    "ep_comm",        # MoE token dispatch and combine over the expert groups (all-to-all / all-gather)
    "interference",   # compute slowed down where it overlaps communication
    "pp_bubble",      # pipeline fill and drain: the critical stage idle, waiting for others
    "pp_p2p",         # pipeline send/recv on the critical path
    "dp_comm",        # gradient reduction (and embedding sync) not hidden behind backward
    "offload",        # activation copies to / from host memory not hidden behind compute (CPU offloading)
    "optimizer",      # optimizer step and the distributed optimizer's parameter all-gather
    "other",          # the rest of the critical stage's step (zero unless a part is unattributed)
)


@dataclass(frozen=True, kw_only=True)
class StepReport:
    """The simulated step of one layout. ``step_time_s == sum(breakdown_s.values())``."""

    step_time_s: float
    breakdown_s: dict[str, float]
    tokens_per_s: float
    model_flops_per_step: float
    model_tflops_per_gpu: float
    mfu: float
    peak_memory_bytes: int
    memory_capacity_bytes: int
    fits_memory: bool
    stage_memory: tuple[StageMemory, ...]
    critical_stage: int
    config: dict
    profile: str
    notes: tuple[str, ...] = ()
    measured_compute_share: float | None = None
    """Share of the critical stage's compute time taken from measured op times (``echo-tune profile``);
    None when the profile has no op-time database."""
    timeline: list = field(default_factory=list, repr=False, compare=False)
    """With ``simulate(..., timeline=True)``: spans (stage, name, category, start_s, end_s)."""
    timeline_args: list = field(default_factory=list, repr=False, compare=False)
    """With a timeline: each span's trace ``args`` (stage, micro-batch, chunk, FLOPs, bytes; sim/outputs/trace_args.py)."""

    @property
    def worst_stage(self) -> StageMemory:
        return max(self.stage_memory, key=lambda m: m.worst_rank_bytes)

    @property
    def memory_overshoot_bytes(self) -> int:
        return max(0, self.peak_memory_bytes - self.memory_capacity_bytes)

    def memory_band(self) -> MemoryBand:
        """fits with X GiB spare / at risk / does not fit (the rule: sim/memory/memory_band.py)."""
        worst = self.worst_stage
        return memory_band(peak_bytes=worst.worst_rank_bytes, reserve_bytes=worst.reserve_bytes,
                           limit_bytes=self.memory_capacity_bytes, stage=worst.stage)

    def memory_verdict(self) -> str:
        return self.memory_band().text

    def to_dict(self) -> dict:
        """The JSON contract of ``echo-tune simulate --json``."""
        return {
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "mfu": self.mfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory_capacity_bytes,
            "fits_memory": self.fits_memory,
            "memory_verdict": self.memory_verdict(),
            "memory_band": self.memory_band().band,
            "critical_stage": self.critical_stage,
            "breakdown_s": dict(self.breakdown_s),
            "stage_memory_bytes": [dict(dataclasses.asdict(m), total_bytes=m.total_bytes) for m in self.stage_memory],
            "config": dict(self.config),
            "profile": self.profile,
            "measured_compute_share": self.measured_compute_share,
            "notes": list(self.notes),
        }
