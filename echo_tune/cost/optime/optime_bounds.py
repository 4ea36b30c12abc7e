"""Physical floors on the op times of a database (issue 41): a time below them was not measured, it was edited
or damaged, and simulating with it gives an MFU above 100%.

- every op: ``MIN_OP_TIME_S``, one nanosecond; no op completes faster on any device (a GPU kernel launch takes
  microseconds, one CPU dispatch hundreds of nanoseconds);
- a GEMM (``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``_scaled_mm``) measured on a CUDA device: its FLOPs over the
  GPU's fastest tensor-core rate (the highest of its datasheet peaks, any precision) at its boost clock
  (``MAX_CLOCK_OVER_PEAK`` x the clock the peak is specified at). Checked when the GPU is a preset; CPU devices
  are left to the first floor (a CPU cluster's GPU numbers are placeholders, not hardware claims).
"""

from __future__ import annotations

import json
import math

from echo_tune.config.load.loading import load_gpu
from echo_tune.errors import ConfigError
from echo_tune.limits import MAX_CLOCK_OVER_PEAK

MIN_OP_TIME_S = 1e-9
# op -> positions of its two matrix operands (A [..., m, k], B [..., k, n])
_GEMMS = {"aten.mm.default": (0, 1), "aten.bmm.default": (0, 1), "aten.addmm.default": (1, 2),
          "aten.baddbmm.default": (1, 2), "aten._scaled_mm.default": (0, 1)}
_PREFIXES = tuple(f'["{name}"' for name in _GEMMS)


def _shape(value) -> list[int] | None:
    shape = value.get("t") if isinstance(value, dict) else None
    if isinstance(shape, list) and len(shape) >= 2 and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                           for n in shape):
        return shape
    return None


def gemm_flops(key: str) -> float | None:
    """FLOPs of a GEMM op key (2 x m x k x n, times the batch); None for any other op or a key that does not read."""
    if not isinstance(key, str) or not key.startswith(_PREFIXES):
        return None
    try:
        name, args, _ = json.loads(key)
    except (ValueError, TypeError, RecursionError):
        return None
    where = _GEMMS.get(name)
    if where is None or not isinstance(args, list) or len(args) <= max(where):
        return None
    a, b = _shape(args[where[0]]), _shape(args[where[1]])
    if a is None or b is None or a[-1] != b[-2]:
        return None
    return 2.0 * math.prod(a[:-1]) * a[-1] * b[-1]


def fastest_tflops(gpu_name: str) -> tuple[float, str] | None:
    """(the GPU's fastest tensor-core TFLOP/s at its boost clock, its name); None when ``gpu_name`` is no preset."""
    try:
        gpu = load_gpu(gpu_name)
    except ConfigError:
        return None
    peaks = [gpu.peak_bf16_tflops, gpu.peak_fp16_tflops, gpu.peak_fp32_tflops, gpu.peak_fp8_tflops,
             gpu.peak_fp4_tflops]
    return max(p for p in peaks if p) * MAX_CLOCK_OVER_PEAK, gpu.name


def check_floors(times: dict[str, float], kind: str, gpu_name: str, path: str) -> None:
    """Refuse, in one line, a database with an op time below a physical floor (the module docstring)."""
    fast = [(k, t) for k, t in times.items() if t < MIN_OP_TIME_S]
    if fast:
        shown = ", ".join(f"{k[:60]!r}: {t!r}" for k, t in fast[:3])
        raise ConfigError(f"op-time database {path!r}: `time_s >= {MIN_OP_TIME_S:g}` (one nanosecond: no op completes "
                          f"faster on any device) must hold for every op, but {len(fast)} row(s) break it ({shown}"
                          f"{', ...' if len(fast) > 3 else ''}); measure again with `echo-tune profile` into a new file")
    peak = fastest_tflops(gpu_name) if kind == "cuda" else None
    if peak is None:
        return
    tflops, name = peak
    fast = []
    for key, t in times.items():
        flops = gemm_flops(key)
        if flops is not None and t < flops / (tflops * 1e12):
            fast.append((key, t, flops))
    if fast:
        key, t, flops = fast[0]
        raise ConfigError(f"op-time database {path!r}: `time_s >= FLOPs / peak` must hold for every GEMM (none runs "
                          f"faster than {name}'s fastest tensor-core rate, {tflops:,.0f} TFLOP/s at its boost clock), "
                          f"but {len(fast)} row(s) break it ({key[:60]!r}: {t:.3g} s for {flops:.3g} FLOPs, "
                          f"{flops / t / 1e12:,.0f} TFLOP/s); measure again with `echo-tune profile` into a new file")
