"""Simulate measured runs and score the predictions: signed error, MAPE, worst row, Spearman."""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.cost.host.host_time import shipped_fit, without_host
from echo_tune.errors import EchoTuneError
from echo_tune.sim.schedule.memo import profile_for_cluster
from echo_tune.sim.simulate import simulate
from echo_tune.validate.runs import RunCase


@dataclass(frozen=True, kw_only=True)
class RowResult:
    name: str
    source: str
    measured_step_time_s: float
    predicted_step_time_s: float | None = None
    fits_memory: bool | None = None
    assumed_flags: tuple[str, ...] = ()
    errata: tuple[str, ...] = ()
    error: str | None = None
    in_sample: bool | None = None
    """True: the row was among the rows its profile's fitted parameters were fitted on (``calibrate fit --runs``,
    or the shipped host time per kernel, cost/host/host_time.py); False: simulated with fitted parameters that never saw
    it (held out); None: nothing in its profile was fitted."""
    profile_label: str | None = None
    """The profile's label when it holds fitted parameters."""

    @property
    def error_pct(self) -> float | None:
        if self.predicted_step_time_s is None:
            return None
        return 100.0 * (self.predicted_step_time_s - self.measured_step_time_s) / self.measured_step_time_s


def fitted_rows(profile) -> set[tuple[str, str]]:
    """(name, source) of the rows a profile was fitted on, with those of the shipped host time per kernel where the
    profile uses it (cost/host/host_time.py)."""
    rows = _row_keys(profile.fitted)
    return rows | _row_keys(shipped_fit()) if profile.uses_default_host_time else rows


def _row_keys(fitted: dict) -> set[tuple[str, str]]:
    return {(r.get("name"), r.get("source")) for r in (fitted.get("rows") or []) if isinstance(r, dict)}


def is_fitted(profile) -> bool:
    """Whether any parameter of the profile was fitted on runs (its own fit, or the shipped host time)."""
    return bool(profile.fitted) or profile.uses_default_host_time


def simulate_case(case: RunCase, profiles: dict | None = None) -> RowResult:
    """Simulate one row; ``profiles`` maps a GPU name to the profile its rows use (default: the cluster's)."""
    common = dict(name=case.name, source=case.source, measured_step_time_s=case.measured_step_time_s,
                  assumed_flags=case.assumed_flags, errata=case.errata)
    if case.error:
        return RowResult(**common, error=case.error)
    profile = (profiles or {}).get(case.cluster.gpu.name)
    used = profile if profile is not None else profile_for_cluster(case.cluster)  # simulate's, cached
    if is_fitted(used):
        common.update(in_sample=(case.name, case.source) in fitted_rows(used), profile_label=used.label)
    try:
        report = simulate(case.model, case.cluster, case.num_gpus, case.parallel, profile=profile)
    except UnmodelledError as exc:
        return RowResult(**common, error=f"refused: {exc}")
    except EchoTuneError as exc:
        return RowResult(**common, error=str(exc))
    return RowResult(**common, predicted_step_time_s=report.step_time_s, fits_memory=report.fits_memory)


def simulate_gpu_side(case: RunCase) -> RowResult:
    """``simulate_case`` with the host time per kernel at 0: the row's GPU side alone, what is left of its
    prediction without the fitted host time (docs/accuracy.md's "host time 0", plan/bands.py)."""
    if case.error or case.cluster is None:
        return simulate_case(case)
    return simulate_case(case, {case.cluster.gpu.name: without_host(profile_for_cluster(case.cluster))})


def _ranks(values: list[float]) -> list[float]:
    """Ranks starting at 1, ties sharing their average rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman rank correlation (Pearson correlation of the ranks); None for fewer than 2 points."""
    if len(xs) < 2:
        return None
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5
    return cov / var if var else None


def summarize(rows: list[RowResult]) -> dict:
    """MAPE, worst row and Spearman over the rows that simulated."""
    scored = [r for r in rows if r.error_pct is not None]
    if not scored:
        return {"n_rows": len(rows), "n_scored": 0, "mape_pct": None, "max_abs_error_pct": None,
                "worst_row": None, "spearman": None}
    worst = max(scored, key=lambda r: abs(r.error_pct))
    return {"n_rows": len(rows), "n_scored": len(scored),
            "mape_pct": sum(abs(r.error_pct) for r in scored) / len(scored),
            "max_abs_error_pct": abs(worst.error_pct), "worst_row": worst.name,
            "spearman": spearman([r.predicted_step_time_s for r in scored], [r.measured_step_time_s for r in scored])}


def by_source(rows: list[RowResult]) -> dict[str, dict]:
    groups: dict[str, list[RowResult]] = {}
    for row in rows:
        groups.setdefault(row.source, []).append(row)
    return {source: summarize(group) for source, group in groups.items()}
