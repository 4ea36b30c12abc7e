"""Fit the compute model of ``cost/kernels/compute.py`` and the interference slowdowns to bench results.

Predictions come from ``op_time_s`` itself, so the fitted coefficients mean what the simulator reads:

* memory: a copy's time = bytes_moved / memory_bandwidth + kernel_launch_overhead (both fitted);
* GEMM: e_max and x_half of the surface e_max * g(m) g(n) g(k), g(x) = x / (x + x_half), with the
  fitted memory bandwidth and launch cost held fixed; efficiencies are against the cluster GPU's
  datasheet peak for the dtype at its peak clock: a bench times each kernel for well under a second, too
  short to heat the GPU into its power limit, so it runs at the boost clock, and the simulator applies the
  sustained clock of long training runs on top (``GPUSpec.clock_factor``);
* attention: one efficiency against the dense peak, forward and backward rows together;
* interference: slowdown(size) = 1 + amplitude * size / (size + half_size_bytes) for compute beside
  a collective and for the collective beside compute; the profile's scalars are the saturated
  values 1 + amplitude (what large, overlapped collectives see).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np
from scipy.optimize import least_squares

from echo_tune.calibrate.fit.results import FitResult, PointResidual
from echo_tune.config.specs.cluster import GPUSpec
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.cost.profile import ClusterProfile
from echo_tune.workload.graph import Op

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _fit(residual_fn, x0: list[float], lower: list[float], upper: list[float]) -> np.ndarray:
    x0 = np.clip(np.array(x0, dtype=float), np.array(lower) + 1e-9, np.array(upper) - 1e-9)
    return least_squares(residual_fn, x0, bounds=(lower, upper)).x


def _op(kind: str, row: dict, **fields) -> Op:
    return Op(name=f"bench.{kind}", kind=kind, phase=row.get("phase", "fwd"), region="bench", **fields)


def _times_s(ops: list[Op], profile: ClusterProfile, gpu: GPUSpec, precision: str) -> np.ndarray:
    at_peak = gpu.replace(sustained_clock_mhz=None)  # bench kernels run at the boost clock (module docstring)
    return np.array([op_time_s(op, profile, at_peak, precision) for op in ops])


def fit_memory(rows: list[dict], profile: ClusterProfile, gpu: GPUSpec,
               quantity: str = "memory bandwidth") -> tuple[ClusterProfile, FitResult]:
    """Memory bandwidth and launch overhead from copies (``bytes_moved``, ``time_us``)."""
    ops = [_op("memory", r, bytes=float(r["bytes_moved"])) for r in rows]
    measured = np.array([r["time_us"] * 1e-6 for r in rows])

    def make(x: np.ndarray) -> ClusterProfile:
        return dataclasses.replace(profile, memory_bandwidth_gbyte_s=float(np.exp(x[0])),
                                   kernel_launch_overhead_s=float(np.exp(x[1])))

    x = _fit(lambda x: np.log(_times_s(ops, make(x), gpu, "fp32") / measured),
             [math.log(profile.memory_bandwidth_gbyte_s), math.log(max(profile.kernel_launch_overhead_s, 1e-7))],
             [math.log(1e-3), math.log(1e-9)], [math.log(1e5), math.log(1e-1)])
    fitted = make(x)
    result = FitResult(quantity=quantity, method="least squares",
                       params={"memory_bandwidth_gbyte_s": round(fitted.memory_bandwidth_gbyte_s, 2),
                               "kernel_launch_overhead_us": round(fitted.kernel_launch_overhead_s * 1e6, 3)},
                       points=_points(rows, _times_s(ops, fitted, gpu, "fp32"), quantity,
                                      lambda r: f"size={r['size_bytes']}"))
    result.flag_poor_fit()
    return fitted, result


def _points(rows: list[dict], predicted_s: np.ndarray, quantity: str, label) -> list[PointResidual]:
    return [PointResidual(quantity=quantity, source=r["_source"], label=label(r), measured=r["time_us"],
                          predicted=float(p) * 1e6, unit="us") for r, p in zip(rows, predicted_s)]


def _peak_note(result: FitResult, gpu: GPUSpec, rows: list[dict]) -> None:
    if any(r.get("device") == "cpu" for r in rows):
        result.warnings.append(f"{result.quantity}: measured on CPU, so its efficiency against the {gpu.name} "
                               f"datasheet peak says nothing about that GPU; bench on the GPUs themselves")


def fit_gemm(rows: list[dict], profile: ClusterProfile, gpu: GPUSpec,
             dtype: str) -> tuple[ClusterProfile, FitResult]:
    """e_max and x_half of the GEMM efficiency surface for one dtype."""
    rows = [r for r in rows if r["dtype"] == dtype]
    ops = [_op("gemm", r, flops=2.0 * r["m"] * r["n"] * r["k"], gemm_mnk=(r["m"], r["n"], r["k"]),
               bytes=float((r["m"] * r["k"] + r["k"] * r["n"] + r["m"] * r["n"]) * ELEMENT_BYTES[dtype])) for r in rows]
    measured = np.array([r["time_us"] * 1e-6 for r in rows])

    def make(x: np.ndarray) -> ClusterProfile:
        return dataclasses.replace(profile, gemm_max_efficiency=float(np.exp(x[0])),
                                   gemm_half_saturation_dim=float(np.exp(x[1])))

    best_tflops = max(2.0 * r["m"] * r["n"] * r["k"] / (r["time_us"] * 1e-6) for r in rows) / 1e12
    start = min(0.9, best_tflops / gpu.peak_tflops(dtype) * 1.2)
    x = _fit(lambda x: np.log(_times_s(ops, make(x), gpu, dtype) / measured),
             [math.log(start), math.log(profile.gemm_half_saturation_dim)],
             [math.log(1e-9), math.log(1.0)], [0.0, math.log(1e6)])
    fitted = make(x)
    quantity = f"gemm {dtype}"
    result = FitResult(quantity=quantity, method="least squares",
                       params={"gemm_max_efficiency": round(fitted.gemm_max_efficiency, 4),
                               "gemm_half_saturation_dim": round(fitted.gemm_half_saturation_dim, 1),
                               "peak_tflops": gpu.peak_tflops(dtype)},
                       points=_points(rows, _times_s(ops, fitted, gpu, dtype), quantity,
                                      lambda r: f"m={r['m']} n={r['n']} k={r['k']}"))
    _peak_note(result, gpu, rows)
    result.flag_poor_fit()
    return fitted, result


def fit_attention(rows: list[dict], profile: ClusterProfile, gpu: GPUSpec) -> tuple[ClusterProfile, FitResult]:
    """Fused-attention efficiencies: the forward's and, when backward rows are measured, the backward's
    (one efficiency for both when only one phase is measured). The bench's kernels are causal, so the
    fitted (unmasked) forward efficiency is the measured rate over the profile's ``attention_causal_factor``:
    the simulator's causal kernels then take exactly the measured rates."""
    dtype = rows[0]["dtype"]
    ops = [_op("attention", r, flops=float(r["flops"]), bytes=float(4 * r["batch"] * r["heads"] * r["seq_len"]
                                                                      * r["head_dim"] * ELEMENT_BYTES[dtype]),
               causal=str(r.get("causal", True)).lower() in ("true", "1"))
           for r in rows]
    measured = np.array([r["time_us"] * 1e-6 for r in rows])
    phases = {op.phase for op in ops}
    split = phases == {"fwd", "bwd"}

    def make(x: np.ndarray) -> ClusterProfile:
        backward = float(np.exp(x[1])) if split else None
        return dataclasses.replace(profile, attention_efficiency=float(np.exp(x[0])),
                                   attention_backward_efficiency=backward)

    def implied(phase: str | None) -> float:  # unmasked start value: causal forwards over the causal factor
        def factor(op) -> float:
            return profile.attention_causal_factor if op.causal and op.phase == "fwd" else 1.0
        return min(1.0, statistics.median(r["flops"] / (r["time_us"] * 1e-6) / (gpu.peak_tflops(dtype) * 1e12)
                                          / factor(op) for r, op in zip(rows, ops) if phase is None or op.phase == phase))

    start = [math.log(implied("fwd")), math.log(implied("bwd"))] if split else [math.log(implied(None))]
    x = _fit(lambda x: np.log(_times_s(ops, make(x), gpu, dtype) / measured),
             start, [math.log(1e-9)] * len(start), [0.0] * len(start))
    fitted = make(x)
    params = {"attention_efficiency": round(fitted.attention_efficiency, 4)}
    if split:
        params["attention_backward_efficiency"] = round(fitted.attention_bwd_efficiency, 4)
    result = FitResult(quantity=f"attention {dtype}", method="least squares", params=params,
                       points=_points(rows, _times_s(ops, fitted, gpu, dtype), f"attention {dtype}",
                                      lambda r: f"{r['phase']} seq={r['seq_len']}"))
    _peak_note(result, gpu, rows)
    result.flag_poor_fit()
    return fitted, result


def _slowdown_curve(rows: list[dict], column: str, quantity: str) -> tuple[float, dict, FitResult]:
    """Saturating curve of one slowdown column against message size; (scalar, curve, result)."""
    sizes = np.array([float(r["size_bytes"]) for r in rows])
    measured = np.array([float(r[column]) for r in rows])
    distinct = sorted(set(sizes.tolist()))
    if len(distinct) >= 3:
        def model(x):
            return 1.0 + np.exp(x[0]) * sizes / (sizes + np.exp(x[1]))
        x = _fit(lambda x: model(x) - measured, [math.log(max(np.max(measured) - 1.0, 1e-3)),
                                                 math.log(float(np.median(sizes)))],
                 [math.log(1e-6), math.log(1.0)], [math.log(100.0), math.log(1e13)])
        amplitude, half = float(np.exp(x[0])), float(np.exp(x[1]))
        predicted, scalar = model(x), 1.0 + amplitude
        curve = {"amplitude": round(amplitude, 4), "half_size_bytes": round(half, 1)}
    else:
        scalar = max(1.0, statistics.median(measured.tolist()))
        predicted, curve = np.full(len(rows), scalar), {"median": round(scalar, 4)}
    curve["points"] = [[int(s), round(float(m), 4)] for s, m in zip(sizes, measured)]
    result = FitResult(quantity=quantity, method="least squares" if len(distinct) >= 3 else "median",
                       params={**{k: v for k, v in curve.items() if k != "points"},
                               "scalar": round(max(scalar, 1.0), 4)},
                       points=[PointResidual(quantity=quantity, source=r["_source"], label=f"size={r['size_bytes']}",
                                             measured=float(m), predicted=float(p), unit="x")
                               for r, m, p in zip(rows, measured, predicted)])
    if scalar < 1.0:
        result.notes.append(f"{quantity}: measured below 1 (noise); the profile keeps 1.0")
    result.flag_poor_fit()  # every fitted curve is judged by the same rule (README: rms > 15 % or a point > 40 %)
    return max(scalar, 1.0), curve, result


def fit_interference(rows: list[dict], profile: ClusterProfile) -> tuple[ClusterProfile, list[FitResult]]:
    compute, compute_curve, compute_result = _slowdown_curve(rows, "compute_slowdown", "compute slowdown")
    comm, comm_curve, comm_result = _slowdown_curve(rows, "comm_slowdown", "comm slowdown")
    fitted = dataclasses.replace(profile, compute_slowdown=round(compute, 4), comm_slowdown=round(comm, 4),
                                 slowdown_curves={"compute": compute_curve, "comm": comm_curve})
    return fitted, [compute_result, comm_result]
