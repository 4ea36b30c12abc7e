"""Maximum GEMM efficiencies of a datasheet profile from public kernel benchmarks (``data/gemm-benchmarks.yaml``).

The ``DATASHEET_*`` GEMM efficiencies of cost/datasheet_efficiencies.py (0.80 bf16, 0.70 FP8) are A100 / H100
benchmark rates over their datasheet peaks. A GPU whose own public benchmarks read differently takes its own,
derived the same way: each listed rate over the GPU's datasheet dense peak and the size saturation at its shape
(cost/kernels/compute.py), averaged per precision. B200 reads 0.69 (bf16: 0.71 in vLLM's harness, in which H100
reads 0.77, 0.66-0.69 in pytorch/ao's) and 0.60 (FP8).
GPUs without entries keep the defaults; a measured profile (``echo-tune calibrate``) replaces both.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

from echo_tune.config.specs.cluster import GPUSpec
from echo_tune.config.load.loading import load_gpu, read_yaml
from echo_tune.cost.kernels.gemm_saturation import size_saturation
from echo_tune.errors import ConfigError

PRECISIONS = {"bf16": "gemm_max_efficiency", "fp8": "fp8_gemm_max_efficiency"}


@lru_cache(maxsize=1)
def _table() -> dict:
    return read_yaml(Path(str(resources.files("echo_tune.cost").joinpath("data", "gemm-benchmarks.yaml"))),
                     "GEMM benchmarks")


def benchmark_efficiencies(gpu: GPUSpec, half_saturation_dim: float) -> tuple[dict[str, float], str]:
    """The profile fields (``gemm_max_efficiency``, ``fp8_gemm_max_efficiency``) the listed benchmarks of ``gpu``
    give, and what a report says of them ({} and "" for a GPU without entries)."""
    table = _table()
    entry = table.get(gpu.name)
    if entry is None:
        return {}, ""
    via, measured_on = "", gpu
    if "same_as" in entry:  # the efficiencies (rate over that GPU's own peak) carry over, not the rates

        via = f" of {entry['same_as']}, applied to {gpu.name} ({entry.get('why', 'same die')})"
        measured_on, entry = load_gpu(entry["same_as"]), table[entry["same_as"]]
    out = {}
    for precision, field in PRECISIONS.items():
        rows = entry.get(precision) or []
        if not rows:
            continue
        peak = measured_on.peak_tflops(precision)
        ratios = [row["tflops"] / (peak * size_saturation(row["m"], row["n"], row["k"], half_saturation_dim))
                  for row in rows]
        value = sum(ratios) / len(ratios)
        if not 0 < value <= 1:
            raise ConfigError(f"data/gemm-benchmarks.yaml: `0 < {field} <= 1` must hold for {gpu.name} {precision}, "
                              f"but got ({field}={value:.3f}); check the rates against the GPU's datasheet peak")
        out[field] = value
    text = ", ".join(f"{p} {out[f]:.2f}" for p, f in PRECISIONS.items() if f in out)
    return out, f"GEMM efficiency {text} from public kernel benchmarks{via} (cost/data/gemm-benchmarks.yaml)"
