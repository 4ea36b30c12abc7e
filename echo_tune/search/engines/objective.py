"""The objective: simulate a layout, keep what trials.csv and best.json need, score it.

A trial's *record* (stored as the trial's ``record`` user attribute) holds the layout by Megatron name,
the derived sizes, the step report's numbers and feasibility. Objectives are read from the record:

=============  ==========================================================================
step_time      simulated step time, seconds (the default)
peak_memory    peak memory of the worst pipeline stage, GiB
num_gpus       GPUs in the run (needs several ``num_gpus`` in the space)
cost           price of one step: step time x GPUs x ``gpu_hour_cost`` / 3600 (GPU-hours if unpriced)
=============  ==========================================================================

Every objective is minimised. A layout that does not fit in memory is *infeasible*: it keeps its
numbers, and carries the constraint ``memory_overshoot_gib > 0`` that Optuna's samplers rank after every
feasible trial; the search never reports it as best.
"""

from __future__ import annotations

from echo_tune.errors import ConfigError
from echo_tune.search.space.layouts import Candidate, RejectedLayout
from echo_tune.search.space.search_space import SearchSpace
from echo_tune.sim.memory.memory_band import PEAK_UNDER_PREDICTION
from echo_tune.sim.memory.step_memory import step_memory
from echo_tune.sim.simulate import simulate

OBJECTIVE_KEYS = {"step_time": "step_time_s", "peak_memory": "peak_memory_gib", "num_gpus": "num_gpus",
                  "cost": "cost_per_step"}
OBJECTIVE_UNITS = {"step_time": "s", "peak_memory": "GiB", "num_gpus": "GPUs", "cost": "per step"}


def objective_label(objective: str, gpu_hour_cost: float | None = None, currency: str = "USD") -> str:
    """Axis and column label of an objective, with its unit (the cost in ``currency`` when priced)."""
    if objective == "cost":
        return "cost per step" + (f" ({currency})" if gpu_hour_cost is not None else " (GPU-hours)")
    return f"{objective.replace('_', ' ')} ({OBJECTIVE_UNITS[objective]})"
# Constraint names (Optuna: > 0 means violated).
MEMORY_CONSTRAINT = "memory_overshoot_gib"
RULE_CONSTRAINT = "breaks_rule"
DERIVED_KEYS = ("data_parallel_size", "num_micro_batches", "pipeline_schedule", "effective_sequence_parallel",
                "effective_recompute_method", "effective_recompute_num_layers")
GIB = 2**30


def cost_per_step(step_time_s: float, num_gpus: int, gpu_hour_cost: float | None) -> float:
    """Price of one step; GPU-hours when no price is given."""
    return step_time_s * num_gpus / 3600.0 * (gpu_hour_cost if gpu_hour_cost is not None else 1.0)


def make_record(space: SearchSpace, candidate: Candidate, report) -> dict:
    """The numbers a trial keeps, from a StepReport. With ``space.safe_memory`` a layout in the "at risk" memory
    band does not fit: its overshoot is what it lacks of the band's margin (sim/memory/memory_band.py)."""
    cfg = report.config
    fits, overshoot = bool(report.fits_memory), int(report.memory_overshoot_bytes)
    if space.safe_memory and fits:
        band = report.memory_band()
        if band.band == "at risk":
            worst = report.worst_stage
            margin = PEAK_UNDER_PREDICTION * max(0, worst.worst_rank_bytes - worst.reserve_bytes)
            fits, overshoot = False, max(1, int(margin - band.spare_bytes))
    return {
        "config": candidate.config,
        "derived": {k: cfg[k] for k in DERIVED_KEYS if k in cfg},
        "step_time_s": report.step_time_s,
        "tokens_per_s": report.tokens_per_s,
        "model_tflops_per_gpu": report.model_tflops_per_gpu,
        "mfu": report.mfu,
        **_memory_keys(report, fits, overshoot),
        "critical_stage": report.critical_stage,
        "breakdown_s": dict(report.breakdown_s),
        "num_gpus": candidate.num_gpus,
        "cost_per_step": cost_per_step(report.step_time_s, candidate.num_gpus, space.gpu_hour_cost),
    }


def _memory_keys(memory, fits: bool, overshoot: int) -> dict:
    """A record's memory keys from a StepReport or a ``StepMemory`` (the same attributes): peak, limit, ``fits`` and
    ``overshoot`` as the record counts them, the floor (search/space/dominance.py) and the worst stage."""
    return {
        "peak_memory_bytes": int(memory.peak_memory_bytes),
        "peak_memory_gib": memory.peak_memory_bytes / GIB,
        "memory_capacity_bytes": int(memory.memory_capacity_bytes),
        "fits_memory": fits,
        "memory_overshoot_bytes": overshoot,
        "memory_floor_bytes": int(max(m.floor_bytes for m in memory.stage_memory)),
        "worst_stage": memory.worst_stage.stage,
    }


def evaluate(space: SearchSpace, candidate: Candidate, *, profile=None, timeline: bool = False, memory=None):
    """Simulate ``candidate``: ``(record, report)``. A rule the simulator adds raises RejectedLayout. ``memory``: what
    ``evaluate_memory`` returned for it with this ``profile`` (not computed again)."""
    try:
        report = simulate(candidate.model, space.cluster, candidate.num_gpus, candidate.parallel, profile=profile,
                          timeline=timeline, memory_headroom_bytes=int(space.memory_headroom_gib * GIB),
                          layout=candidate.layout, known_memory=None if memory is None else memory.stage_memory)
    except ConfigError as exc:
        raise RejectedLayout(str(exc), candidate.config) from None
    return make_record(space, candidate, report), report


def memory_record(space: SearchSpace, candidate: Candidate, memory) -> dict:
    """What a trial keeps of a layout whose memory alone was computed (``sim/memory/step_memory.StepMemory``): the
    record's memory keys (``make_record``'s, the same numbers), no step time. Never fits: only a layout over its
    memory by more than the memory model's error is stored this way (``dominance.OVER_MEMORY``)."""
    return {"derived": {k: memory.derived[k] for k in DERIVED_KEYS if k in memory.derived},
            **_memory_keys(memory, False, max(1, int(memory.memory_overshoot_bytes))), "num_gpus": candidate.num_gpus}


def evaluate_memory(space: SearchSpace, candidate: Candidate, *, profile=None):
    """``candidate``'s memory alone (``step_memory``), or None where it needs the step's timing. A rule the simulator
    adds raises RejectedLayout."""
    try:
        return step_memory(candidate.model, space.cluster, candidate.num_gpus, candidate.parallel, profile=profile,
                           memory_headroom_bytes=int(space.memory_headroom_gib * GIB), layout=candidate.layout)
    except ConfigError as exc:
        raise RejectedLayout(str(exc), candidate.config) from None


def objective_values(space: SearchSpace, record: dict) -> list[float]:
    return [float(record[OBJECTIVE_KEYS[o]]) for o in space.objectives]


def constraints(record: dict) -> dict[str, float]:
    """Optuna constraints of a simulated layout: the memory overshoot in GiB (> 0 when it does not fit)."""
    if record["fits_memory"]:
        return {MEMORY_CONSTRAINT: 0.0}
    return {MEMORY_CONSTRAINT: max(record["memory_overshoot_bytes"] / GIB, 1e-9)}


# A layout that breaks a rule ranks after every simulated one, however far over memory.
REJECTED_CONSTRAINTS = {RULE_CONSTRAINT: 1e6}


class Evaluator:
    """``evaluate`` with an in-process cache: a sampler proposing a layout again costs no simulation."""

    def __init__(self, space: SearchSpace, profile=None):
        self.space, self.profile = space, profile
        self._cache: dict[tuple, dict] = {}
        self.simulated = 0

    def __call__(self, candidate: Candidate) -> dict:
        key = candidate.key
        if key not in self._cache:
            self._cache[key] = evaluate(self.space, candidate, profile=self.profile)[0]
            self.simulated += 1
        return self._cache[key]


# --- how a trial is stored for Optuna's and optuna-dashboard's own readers --------------------------------
# optuna-dashboard 0.21 reads a trial's constraints from the system attribute "constraints" (a sequence, the
# format Optuna's ``constraints_func`` writes) and takes the best trial from ``storage.get_best_trial``, which
# ignores constraints; it cuts a non-string user attribute at 1024 characters (``MAX_ATTR_LENGTH`` in its
# ``_serializer.py``). So a trial also gets: the constraint as that sequence, +inf as the stored value of a
# layout that does not fit (its real numbers stay in the record and the flat attributes), and the record's
# numbers as flat scalar attributes, which the dashboard shows whole.
CONSTRAINTS_SYSTEM_ATTR = "constraints"


def told_values(space: SearchSpace, record: dict) -> list[float]:
    """The values stored in Optuna: the objectives, or +inf for a layout that does not fit, so that
    ``study.best_trial``, the dashboard's best trial and ``trials_dataframe().sort_values("value")`` never
    put an out-of-memory layout first."""
    if not record["fits_memory"]:
        return [float("inf")] * len(space.objectives)
    return objective_values(space, record)


def constraint_sequence(record: dict | None) -> tuple[float, ...]:
    """The trial's constraints as the sequence optuna-dashboard reads (> 0: infeasible)."""
    values = constraints(record) if record is not None else REJECTED_CONSTRAINTS
    return tuple(float(v) for v in values.values())


def flat_attrs(record: dict) -> dict:
    """The record's numbers as scalar user attributes (never cut by the dashboard)."""
    out = {key: record[key] for key in ("step_time_s", "tokens_per_s", "mfu", "peak_memory_gib", "fits_memory",
                                        "cost_per_step", "num_gpus")}
    out["memory_overshoot_gib"] = record["memory_overshoot_bytes"] / GIB
    out.update({f"breakdown_{part}_s": seconds for part, seconds in record["breakdown_s"].items()})
    out.update({f"derived_{k}": v for k, v in record["derived"].items() if isinstance(v, (int, float, str, bool))})
    return out
