"""Calibrate from training runs: fit at most three physically named parameters to measured step times.

Parameters (``PARAMETERS``), each applied by the simulator when the profile is used:

- ``clock``: ``sustained_clock_mhz``, the SM clock compute-bound kernels (GEMMs, attention) run at; their
  time scales with peak / this clock, memory-bound time does not (cost/kernels/compute.py). What the residuals of
  whole-step times mostly carry: power-limited clocks and GEMM efficiency move every compute-bound kernel
  together, and the two cannot be told apart from step times, so one is fitted, as a clock.
- ``comm``: ``comm_time_factor``, every collective's modelled time times this (latencies x f, bandwidths / f:
  achieved against modelled network efficiency, congestion at scale); it moves only the exposed part of the
  step, so it is identified by runs with different exposed communication.
- ``launch``: ``kernel_launch_overhead_s``, time added to every kernel (launch latency and tail, on the GPU's
  critical path whatever the host does); it moves small models and short steps most.
- ``host``: ``host_time_per_kernel_s``, the host's time to issue one kernel; the GPU waits on the host only where
  a pass's kernels run shorter than that (``cost/host/host_bound.py``): it moves passes of many short kernels
  (fine-grained MoE layers: a GEMM and its quantisations per expert) and leaves GEMM-bound passes alone.

Objective: relative step-time residuals r_i = predicted_i / measured_i - 1, in least squares with a soft-L1
weight (``robust_scale``: a row off by much more than it counts as |r|, not r^2, so that a row whose error is
structure none of the parameters stands for, e.g. an unmodelled kernel, does not drag the fit). Solver:
Levenberg-Marquardt on log-parameters with forward-difference Jacobians; every evaluation simulates every row
(each row is ~20 ms: models, layouts and traces are built once per row and cached by the simulator).

Errors: in-sample; leave-one-out (a Gauss-Newton refit without the row on the Jacobian at the fit); and
leave-one-source-out (a full refit without the source's rows, predicting them; where no other source is left
the held-out prediction is the unfitted profile's). A row's source is the dataset or paper it comes from
(``source_key``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from echo_tune.calibrate.fit.results import POOR_FIT_MAX, POOR_FIT_RMS
from echo_tune.cost.profile import ClusterProfile
from echo_tune.errors import ConfigError
from echo_tune.sim.simulate import simulate

PARAMETERS = {"clock": "sustained_clock_mhz", "comm": "comm_time_factor", "launch": "kernel_launch_overhead_s",
              "host": "host_time_per_kernel_s"}
# physical ranges: a clock between half and 1.1x the peak clock (max boost is ~1.08x the tensor-core peak
# clock on H100 SXM: 1,980 vs 1,830 MHz); network time 0.3x..3.3x the modelled; launch time per kernel 0.1x..10x;
# host time per kernel issued from Python: a fixed range, whatever the start (``HOST_TIME_RANGE_S``)
HOST_TIME_START_S = 13.5e-6
"""Where the host time per kernel starts when neither the profile nor the shipped default (cost/host/host_time.py)
gives one: a torch ``nn.Linear`` forward's CPU time (one cuBLAS kernel) on a DGX H100's Xeon 8480C,
NVIDIA/TransformerEngine issue 2053 (BF16, hidden 2048, 8,192 tokens)."""
HOST_TIME_RANGE_S = (HOST_TIME_START_S, 140e-6)
"""The host time per kernel issued from Python, physically (each end from measurement, not from the rows): at least
one Python-level torch call that launches a kernel (``HOST_TIME_START_S``); at most the ~10 Python-level torch calls
Megatron makes per traced op in its MoE layer's forward (counted in Megatron-LM d98e8a64's own code by
benchmarks/megatron_host_ops.py; cost/host/host_time.py) at that cost each, 135 us, rounded up. A fit that ends at
either end is reported at its range edge (a missing mechanism), not shipped (tests/cost/host/test_host_bound.py)."""
BOUNDS = {"sustained_clock_mhz": ("peak", 0.5, 1.1), "comm_time_factor": ("start", 0.3, 3.3),
          "kernel_launch_overhead_s": ("start", 0.1, 10.0),
          "host_time_per_kernel_s": ("absolute", *HOST_TIME_RANGE_S)}
PUBLISHED_RUNS_DIR = Path(__file__).resolve().parents[3] / "calibration" / "published-runs"


def _range_text(name: str) -> str:
    kind, low, high = BOUNDS[name]
    return f"{name} {low:g}-{high:g}" if kind == "absolute" else f"{name} {low:g}-{high:g}x its {kind} value"


def source_key(source: str) -> str:
    """The dataset or paper of a row's source text: the repository or paper name before a commit, a
    parenthesis, a file or a section ("NVIDIA/dgxc-benchmarking@35a9... llama3.1/..." -> "NVIDIA/dgxc-benchmarking")."""
    return re.split(r"@| \(| README|,|;| docs/", source.strip(), maxsplit=1)[0].strip() or "unknown"


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class RunFit:
    """What ``fit_runs`` found."""

    profile: ClusterProfile
    params: dict[str, float]
    rows: list[dict]
    in_sample_mape_pct: float
    loo_mape_pct: float
    loso_mape_pct: float
    loso_by_source: dict[str, float]
    warnings: list[str] = field(default_factory=list)


def start_values(profile: ClusterProfile, gpu) -> dict[str, float]:
    """Where each parameter starts (and stays, when not fitted). A GPU that states no clock has none: a fit of
    the other parameters then carries no clock (it once wrote sustained_clock_mhz 0, which the profile refuses)."""
    clock = profile.fitted_clock_mhz or gpu.sustained_clock_mhz or gpu.peak_clock_mhz
    return {**({"sustained_clock_mhz": float(clock)} if clock else {}),
            "comm_time_factor": profile.comm_time_factor,
            "kernel_launch_overhead_s": profile.kernel_launch_overhead_s,
            "host_time_per_kernel_s": min(max(profile.host_time_per_kernel_s or HOST_TIME_START_S,
                                              HOST_TIME_RANGE_S[0]), HOST_TIME_RANGE_S[1])}


def with_params(base: ClusterProfile, values: dict[str, float], fitted: dict | None = None) -> ClusterProfile:
    """``base`` with the fitted values applied (the launch overhead in its own field, the rest in ``fitted``)."""
    fitted = {"params": {k: float(v) for k, v in values.items()},
              **{k: v for k, v in (fitted or {}).items() if k != "params"}}
    launch = values.get("kernel_launch_overhead_s", base.kernel_launch_overhead_s)
    return dataclasses.replace(base, kernel_launch_overhead_s=float(launch), fitted=fitted)


class _Problem:
    """Rows, base profile (one per GPU type: ``bases``) and the names fitted; ``predict(x)`` simulates every row at
    log-parameters x."""

    def __init__(self, cases, base: ClusterProfile, names: list[str], start: dict[str, float], peak_clock_mhz,
                 bases: dict[str, ClusterProfile] | None = None):
        self.cases, self.base, self.names, self.start = cases, base, names, start
        self.bases = bases or {}
        self.measured = np.array([c.measured_step_time_s for c in cases])
        ref = {"peak": peak_clock_mhz or 1.0, "absolute": 1.0}
        self.lower = np.array([math.log(ref.get(BOUNDS[n][0], start[n]) * BOUNDS[n][1] / start[n]) for n in names])
        self.upper = np.array([math.log(ref.get(BOUNDS[n][0], start[n]) * BOUNDS[n][2] / start[n]) for n in names])

    def values(self, x) -> dict[str, float]:
        out = dict(self.start)
        for name, xi in zip(self.names, x):
            out[name] = self.start[name] * math.exp(xi)
        return out

    def predict(self, x, rows=None) -> np.ndarray:
        values = self.values(x)
        profile = with_params(self.base, values)
        own = {gpu: with_params(base, values) for gpu, base in self.bases.items()}
        rows = range(len(self.cases)) if rows is None else rows
        return np.array([simulate(self.cases[i].model, self.cases[i].cluster, self.cases[i].num_gpus,
                                  self.cases[i].parallel, profile=own.get(self.cases[i].cluster.gpu.name, profile)
                                  ).step_time_s for i in rows])

    def residuals(self, x, rows=None) -> np.ndarray:
        rows = list(range(len(self.cases))) if rows is None else list(rows)
        return self.predict(x, rows) / self.measured[rows] - 1.0

    def jacobian(self, x, r, rows, step: float = 0.02) -> np.ndarray:
        cols = []
        for j in range(len(x)):
            xj = np.array(x, dtype=float)
            h = step if x[j] + step <= self.upper[j] else -step  # never past the physical range (a clock over
            xj[j] += h                                           # 1.1x peak is refused by the cluster spec)
            cols.append((self.residuals(xj, rows) - r) / h)
        return np.stack(cols, axis=1)


def _weights(r: np.ndarray, scale: float) -> np.ndarray:
    """Square roots of the soft-L1 IRLS weights, (1 + (r/s)^2)^-1/4 (1 for plain least squares)."""
    return np.ones_like(r) if scale <= 0 else (1.0 + (r / scale) ** 2) ** -0.25


def _loss(r: np.ndarray, scale: float) -> float:
    """Soft-L1 loss 2 s^2 (sqrt(1 + (r/s)^2) - 1) (r^2 for small r; plain least squares for s <= 0)."""
    return float(np.sum(r ** 2)) if scale <= 0 else float(np.sum(2 * scale ** 2 * (np.sqrt(1 + (r / scale) ** 2) - 1)))


def _solve(problem: _Problem, rows: list[int], x0, scale: float, iterations: int = 40):
    """Levenberg-Marquardt from x0 on ``rows``: (x, residuals, Jacobian at x)."""
    x = np.array(x0, dtype=float)
    r = problem.residuals(x, rows)
    lam = 1e-3
    J = problem.jacobian(x, r, rows)
    for _ in range(iterations):
        w = _weights(r, scale)
        A, b = J * w[:, None], r * w
        H = A.T @ A
        step = -np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-9), A.T @ b)
        x_new = np.clip(x + step, problem.lower, problem.upper)
        r_new = problem.residuals(x_new, rows)
        if _loss(r_new, scale) < _loss(r, scale):
            # a small step counts as converged only while the damping is light: after rejected steps (a start on a
            # flat stretch, where the parameter does not yet bind) the damped steps are small however far the optimum is
            converged = np.max(np.abs(x_new - x)) < 1e-3 and lam < 0.1
            x, r, lam = x_new, r_new, lam / 3
            if converged:
                break
            J = problem.jacobian(x, r, rows)
        else:
            lam *= 10
            if lam > 1e6:
                break
    return x, r, J


def collapse_duplicates(cases) -> tuple[list, list[str]]:
    """One row per distinct run: rows with the same model, layout, cluster and GPU count (whatever their names
    and sources) are one piece of evidence, fitted once at the median of their measured step times; fifty
    copies of a row would otherwise outweigh every other row and make leave-one-out meaningless (a copy
    predicts its twin)."""
    groups: dict[str, list[int]] = {}
    for i, case in enumerate(cases):
        key = repr((case.model.replace(name=""), case.cluster, case.num_gpus, case.parallel))
        groups.setdefault(key, []).append(i)
    kept, warnings = [], []
    for members in groups.values():
        first = cases[members[0]]
        if len(members) > 1:
            measured = float(np.median([cases[i].measured_step_time_s for i in members]))
            names = [cases[i].name for i in members]
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            warnings.append(f"{len(members)} rows are the same run (model, layout, cluster, GPU count): {shown}; "
                            f"fitted as one row at their median step time {measured:.4g} s")
            first = dataclasses.replace(first, measured_step_time_s=measured)
        kept.append(first)
    return kept, warnings


def fit_runs(cases, base: ClusterProfile, gpu, *, params: tuple[str, ...] = ("clock", "comm", "launch"),
             robust_scale: float = 0.10, inputs: list[dict] | None = None, command: str = "",
             published: bool = False, bases: dict[str, ClusterProfile] | None = None) -> RunFit:
    """Fit ``params`` to the measured step times of ``cases`` (RunCases that simulate, one GPU type; or several,
    each run with its own GPU's profile from ``bases``, for ``host`` alone: the host's time per kernel is the
    host's, not the GPU's, so rows of GPUs on the same kind of host fit one value)."""
    unknown = [p for p in params if p not in PARAMETERS]
    if unknown or not params or len(set(params)) != len(params) or len(params) > 3:
        raise ConfigError(f"`--params` must be 1-3 distinct names of {sorted(PARAMETERS)}, but got ({','.join(params)})")
    if "clock" in params and gpu.peak_clock_mhz is None:
        raise ConfigError(f"GPU {gpu.name!r} states no peak_clock_mhz, so a clock cannot be fitted; add it to the GPU "
                          f"mapping or leave 'clock' out of --params")
    overridden = sorted({c.name for c in cases if c.cluster.sustained_clock_mhz is not None})
    if "clock" in params and overridden:
        raise ConfigError(f"rows {overridden} run on a cluster that fixes sustained_clock_mhz, which a fitted clock "
                          f"cannot change; drop the key from their cluster file or leave 'clock' out of --params")
    gpus = sorted({c.cluster.gpu.name for c in cases})
    if len(gpus) > 1 and tuple(params) != ("host",):
        raise ConfigError(f"`--params host` must be the only parameter fitted on rows of several GPU types (a clock, "
                          f"network factor or launch time is a GPU's), but got (GPUs={','.join(gpus)}, "
                          f"params={','.join(params)}); fit one GPU at a time or only host")
    missing = [g for g in gpus if g not in (bases or {})] if len(gpus) > 1 else []
    if missing:
        raise ConfigError(f"rows of several GPU types need a base profile for each, but got none for {missing}")
    names = [PARAMETERS[p] for p in params]
    given = len(cases)
    cases, duplicate_warnings = collapse_duplicates(cases)
    if len(cases) < len(names) + 2:
        distinct = "" if given == len(cases) else f" distinct (of {given} given: duplicates count once)"
        raise ConfigError(f"`rows >= parameters + 2` must hold, but got (rows={len(cases)}{distinct}, "
                          f"parameters={len(names)}); give more runs or fewer --params")
    problem = _Problem(cases, base, names, start_values(base, gpu), gpu.peak_clock_mhz, bases if len(gpus) > 1 else None)
    everything = list(range(len(cases)))
    unfitted = problem.predict(np.zeros(len(names)))
    x, r, J = _solve(problem, everything, np.zeros(len(names)), robust_scale)
    # leave one out: one weighted Gauss-Newton refit without the row, on the Jacobian at the fit, over the
    # parameters inside their range (the step with every row is subtracted: what is left is the row's pull)
    w = _weights(r, robust_scale)
    free = [j for j in range(len(names)) if problem.lower[j] + 1e-9 < x[j] < problem.upper[j] - 1e-9]
    loo = r.copy()
    if free:
        A, b = J[:, free] * w[:, None], r * w
        base_step = np.linalg.lstsq(A, -b, rcond=None)[0]
        for i in everything:
            keep = [k for k in everything if k != i]
            delta = np.linalg.lstsq(A[keep], -b[keep], rcond=None)[0] - base_step
            loo[i] = r[i] + J[i, free] @ delta
    # leave one source out: a full refit without the source's rows
    keys = [source_key(c.source) for c in cases]
    loso = np.empty(len(cases))
    for key in sorted(set(keys)):
        held = [i for i in everything if keys[i] == key]
        kept = [i for i in everything if keys[i] != key]
        if len(kept) >= len(names) + 2:
            x_k, _, _ = _solve(problem, kept, x, robust_scale)
            loso[held] = problem.residuals(x_k, held)
        else:  # too few rows of other sources: the held-out rows get the unfitted prediction
            loso[held] = unfitted[held] / problem.measured[held] - 1.0
    mape = lambda v: float(np.mean(np.abs(v)) * 100)  # noqa: E731
    loso_by = {key: mape(loso[[i for i in everything if keys[i] == key]]) for key in sorted(set(keys))}
    values = problem.values(x)
    predicted = (r + 1.0) * problem.measured
    rows = [{"name": c.name, "source": c.source, "source_key": keys[i], "measured_step_time_s": float(c.measured_step_time_s),
             "predicted_step_time_s": float(predicted[i]), "unfitted_step_time_s": float(unfitted[i]),
             "error_pct": float(r[i] * 100), "loo_error_pct": float(loo[i] * 100),
             "loso_error_pct": float(loso[i] * 100)} for i, c in enumerate(cases)]
    warnings = list(duplicate_warnings)
    rms = float(np.sqrt(np.mean(r ** 2)))
    if rms > POOR_FIT_RMS or np.max(np.abs(r)) > POOR_FIT_MAX:  # the rule of every fit (results.py)
        worst = int(np.argmax(np.abs(r)))
        warnings.append(f"poor fit of step times: rms error {rms:.0%}, worst {r[worst]:+.0%} at {cases[worst].name}; "
                        f"the model misses part of these runs")
    if mape(loo) > 2 * mape(r):
        warnings.append(f"leave-one-out MAPE {mape(loo):.1f}% is over twice the in-sample {mape(r):.1f}%: the fit "
                        f"leans on single rows; fit fewer --params or add runs")
    at_bound = [n for n, xi, lo, hi in zip(names, x, problem.lower, problem.upper) if xi <= lo + 1e-9 or xi >= hi - 1e-9]
    if at_bound:
        ranges = ", ".join(_range_text(n) for n in at_bound)
        warnings.append(f"fitted at the edge of its physical range ({ranges}): the rows ask for more than this "
                        f"parameter can physically give; look at the worst rows, or leave it out of --params")
    # a parameter no row's step time moves at the fit (e.g. a host time per kernel no pass of these runs waits on)
    # is not identified by these runs: its value is the start, not a measurement
    unidentified = [p for p, col in zip(params, J.T) if not np.any(np.abs(col) > 1e-12)]
    if unidentified:
        warnings.append(f"not identified by these runs (no row's step time moves with it): {', '.join(unidentified)}; "
                        f"leave it out of --params")
    sources = sorted(set(keys))
    label = f"fitted on {'published runs' if published else 'runs'}: {', '.join(sources)}"
    fitted = {"label": label, "command": command, "parameters": list(params),
              "start": {n: problem.start[n] for n in names}, "robust_scale": robust_scale,
              "inputs": inputs or [], "sources": sources,
              "at_range_edge": [p for p, n in zip(params, names) if n in at_bound], "unidentified": unidentified,
              "errors": {"rows": len(cases), "in_sample_mape_pct": round(mape(r), 3),
                         "unfitted_mape_pct": round(mape(unfitted / problem.measured - 1), 3),
                         "loo_mape_pct": round(mape(loo), 3), "loso_mape_pct": round(mape(loso), 3),
                         "loso_by_source_mape_pct": {k: round(v, 3) for k, v in loso_by.items()}},
              "rows": [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in row.items()} for row in rows]}
    profile = with_params(base, {n: values[n] for n in names}, fitted)
    profile = dataclasses.replace(profile, name=f"{'+'.join(gpus) if len(gpus) > 1 else gpu.name}-fitted-on-runs")
    return RunFit(profile=profile, params={n: values[n] for n in names}, rows=rows, in_sample_mape_pct=mape(r),
                  loo_mape_pct=mape(loo), loso_mape_pct=mape(loso), loso_by_source=loso_by, warnings=warnings)


