"""Read a study back: one row per trial, the best feasible layout, the Pareto front."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from optuna.trial import FrozenTrial, TrialState

from echo_tune.config.launch.megatron_args import MODEL_FLAGS, to_megatron_flags
from echo_tune.search.space.fields import MODEL_LAYOUT_FIELDS
from echo_tune.search.space.layouts import Candidate, draw
from echo_tune.search.engines.objective import OBJECTIVE_KEYS, evaluate, objective_values
from echo_tune.search.space.search_space import FIELD_ORDER, SearchSpace

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


def finished_count(study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def trial_record(trial: FrozenTrial) -> dict | None:
    """The simulated record of a completed trial, or None (rejected, failed, running)."""
    if trial.state != TrialState.COMPLETE:
        return None
    return trial.user_attrs.get("record")


def untimed_record(trial: FrozenTrial) -> dict | None:
    """The memory record of a layout stored over memory without its step simulated (``dominance.OVER_MEMORY``):
    peak, limit, overshoot, floor, derived sizes and ``config``, no step time; None for any other trial."""
    memory = trial.user_attrs.get("memory")
    if trial.state != TrialState.PRUNED or not isinstance(memory, dict):
        return None
    return {**memory, "config": trial.user_attrs["config"]}


def is_feasible(trial: FrozenTrial) -> bool:
    record = trial_record(trial)
    return record is not None and record["fits_memory"]


def feasible_records(trials: list[FrozenTrial]) -> list[tuple[int, dict]]:
    return [(t.number, trial_record(t)) for t in trials if is_feasible(t)]


def best_feasible(space: SearchSpace, trials: list[FrozenTrial]) -> tuple[int, dict] | None:
    """The feasible trial with the lowest first objective (ties: the earlier trial)."""
    return best_of(space, feasible_records(trials))


def best_of(space: SearchSpace, rows: list[tuple[int, dict]]) -> tuple[int, dict] | None:
    """``best_feasible`` over (number, record) rows already read (``feasible_records``)."""
    if not rows:
        return None
    return min(rows, key=lambda nr: (objective_values(space, nr[1])[0], nr[0]))


def pareto_of(space: SearchSpace, rows: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """The feasible (number, record) ``rows`` (``feasible_records``) that no other dominates, sorted by the first
    objective. Layouts with identical objective values keep only the earliest trial."""
    points = [(tuple(objective_values(space, r)), n, r) for n, r in rows]
    points.sort(key=lambda p: (p[0], p[1]))
    front, seen = [], set()
    for values, number, record in points:
        if values in seen:
            continue
        dominated = any(all(o <= v for o, v in zip(other, values)) and other != values for other, _, _ in points)
        if not dominated:
            front.append((number, record))
            seen.add(values)
    return front


def candidate_of(space: SearchSpace, record: dict) -> Candidate:
    """Rebuild the Candidate of a stored record (through the same drawing rules)."""
    config = record["config"]
    return draw(space, lambda name, values: config[name])


def model_fields(space: SearchSpace, config: dict | None = None) -> dict:
    """The model's flags, with a layout's values of the model settings it searches (``config``)."""
    out = {f: getattr(space.model, f) for f in MODEL_FLAGS}
    out.update({f: config[f] for f in MODEL_LAYOUT_FIELDS if config is not None and f in config})
    return out


def megatron_flags(space: SearchSpace, record: dict) -> list[str]:
    """The layout as Megatron-LM flags (model size, parallel layout, batch sizes, precision, the model settings
    the layout searched: dispatcher, shared-expert overlap, fusions)."""
    parallel = {k: (tuple(v) if isinstance(v, list) else v) for k, v in record["config"].items()
                if k not in ("num_gpus", "precision") and k not in MODEL_LAYOUT_FIELDS}
    return to_megatron_flags(model_fields(space, record["config"]), parallel, record["config"]["precision"])


def spec_dicts(space: SearchSpace) -> dict:
    """Model and cluster as plain dicts (in best.json, so ``echo-tune rank`` can rebuild them)."""
    cluster = dataclasses.asdict(space.cluster)
    cluster.pop("extra", None)
    cluster["profile"] = str(cluster["profile"]) if cluster["profile"] is not None else None
    return {"model_spec": dataclasses.asdict(space.model), "cluster_spec": cluster}


def entry(space: SearchSpace, number: int, record: dict, *, profile=None) -> dict:
    """A best/Pareto entry: the simulator's keys (StepReport.to_dict) with ``config`` by Megatron name."""
    _, report = evaluate(space, candidate_of(space, record), profile=profile)
    data = report.to_dict()
    derived = {k: v for k, v in data.pop("config").items() if k not in record["config"] and k != "model_spec"}
    return {"step_time_s": data.pop("step_time_s"), "config": dict(record["config"]), **data,
            "derived": derived, "trial": number,
            "objectives": {o: record[OBJECTIVE_KEYS[o]] for o in space.objectives},
            # a price per step only with a price (the record's objective is GPU-hours without one)
            "cost_per_step": record["cost_per_step"] if space.gpu_hour_cost is not None else None,
            "gpu_hours_per_step": record["step_time_s"] * record["num_gpus"] / 3600.0,
            "megatron_args": " ".join(megatron_flags(space, record)), "specs": spec_dicts(space)}


def trial_row(space: SearchSpace, trial: FrozenTrial) -> dict:
    """One trials.csv row: settings by Megatron name, the report's parts, feasibility, the broken rule."""
    record = trial_record(trial)
    row = {"trial": trial.number, "state": trial.state.name,
           "feasible": bool(record and record["fits_memory"]),
           "baseline": bool(trial.user_attrs.get("baseline", False)),
           "rejected_rule": trial.user_attrs.get("rejected_rule", ""),
           "dominated_by": trial.user_attrs.get("dominated_by", "")}
    config = record["config"] if record else trial.user_attrs.get("config", trial.params)
    for name in FIELD_ORDER:
        row[name] = config.get(name, "")
    row["global_batch_size"] = space.global_batch_size
    row["precision"] = space.precision
    memory = None if record else untimed_record(trial)  # a layout over memory beyond the band: no step time
    if record or memory:
        row.update((record or memory)["derived"])
        for key in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "peak_memory_bytes",
                    "peak_memory_gib", "memory_capacity_bytes", "fits_memory", "memory_overshoot_bytes",
                    "worst_stage", "critical_stage", "cost_per_step"):
            row[key] = record[key] if record else memory.get(key, "")
    if record:
        for part, seconds in record["breakdown_s"].items():
            row[f"{part}_s"] = seconds
    return row


@dataclass
class SearchResult:
    study_name: str
    sampler: str
    n_trials: int
    n_feasible: int
    n_infeasible: int
    n_rejected: int
    new_trials: int
    space_size: int
    wall_time_s: float
    best: dict | None
    pareto: list[dict]
    results_dir: str
    storage: str
    files: list[str] = field(default_factory=list)
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    top: list[dict] = field(default_factory=list)
    """The best feasible trials' records (first objective), for the terminal table: the best of each layout's
    VPP / recompute variants, with ``variants`` and ``variant_span`` (outputs/top_rows.py)."""
    n_dominated: int = 0
    """Finished trials not simulated because another layout of the space is at least as good (dominance.py);
    counted in ``n_trials`` and the coverage, not in ``n_rejected``."""
    n_dominated_memory: int = 0
    """Of ``n_dominated``, those that cannot fit (``dominance.DOMINATED_BY_MEMORY``); the rest can only be slower."""
    n_untimed: int = 0
    """Of ``n_infeasible``, the layouts over memory beyond the memory model's error whose step was not simulated
    (``dominance.OVER_MEMORY``; counted in ``n_trials``, not in ``n_dominated``)."""
    untimed: list[dict] | None = field(default=None, repr=False, compare=False)
    """Their memory records (``untimed_record``; not in ``to_dict``): what the closest miss reads besides ``records``."""
    n_distinct: int | None = None
    """Distinct layouts the finished trials hold (``accounting.py``; None: ``n_trials``)."""
    n_duplicates: int = 0
    """Finished trials beyond the first of their layout (stored twice by a killed or concurrent run)."""
    missing: list[str] = field(default_factory=list)
    """Labels of the valid layouts a run that should have covered the space never stored."""
    records: list[dict] | None = field(default=None, repr=False, compare=False)
    """Every simulated record of the study as it ended (not in ``to_dict``): what the near-tie check and the
    explanation read, without opening the storage again (on a 43,194-trial journal that re-read took ~5 s)."""

    @property
    def n_simulated(self) -> int:
        """Finished trials that were simulated or rejected by a rule (not dominated)."""
        return self.n_trials - self.n_dominated

    @property
    def coverage(self) -> float:
        """Share of the space's valid layouts covered: simulated, or dominated by one simulated (distinct layouts
        of the finished trials / valid layouts: a layout stored twice counts once, ``accounting.py``)."""
        covered = self.n_trials if self.n_distinct is None else self.n_distinct
        return min(1.0, covered / self.space_size) if self.space_size else 0.0

    def to_dict(self) -> dict:
        data = {"study_name": self.study_name, "sampler": self.sampler, "n_trials": self.n_trials,
                "n_feasible": self.n_feasible, "n_infeasible": self.n_infeasible, "n_rejected": self.n_rejected,
                "n_dominated": self.n_dominated, "n_dominated_memory": self.n_dominated_memory,
                "n_untimed": self.n_untimed, "new_trials": self.new_trials, "space_size": self.space_size, "coverage": self.coverage,
                "n_distinct": self.n_trials if self.n_distinct is None else self.n_distinct,
                "n_duplicates": self.n_duplicates, "missing": self.missing,
                "wall_time_s": self.wall_time_s,
                "best": self.best, "results_dir": self.results_dir, "storage": self.storage, "files": self.files,
                "interrupted": self.interrupted, "notes": self.notes}
        if len(self.pareto) or (self.best and len(self.best.get("objectives", {})) > 1):
            data["pareto"] = self.pareto
        return data
