"""Error bands: how far the simulator's step times were from measured runs of the same *family*.

A family is (GPU, dense or MoE, precision: bf16 or fp8, scale: GPUs up to 64, up to 512, or more). The
table ``error_bands.json`` beside this module is built from ``echo-tune validate``'s rows on the shipped
published-runs CSVs by::

    python -m echo_tune.plan.bands calibration/published-runs/runs_megatron.csv \
        calibration/published-runs/runs_modern.csv

(the command and the simulator's version are stored in the file). Each family keeps its row count, its mean
absolute error, its mean signed error and its lowest and highest signed error in percent; a prediction is shown
with the range of measured / predicted over its family's runs (``band_text``), which lies above 1 where the
family's runs all took longer than predicted (the H100 rows, docs/accuracy.md) instead of around it.

A prediction takes the band of its own family; if no validated run shares it, the nearest family with the
same GPU, dense/MoE and precision (another scale), then the same GPU architecture (Ampere, Hopper,
Blackwell), then the same dense/MoE and precision (any GPU); outside all of those it says so and takes the
band of all rows.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path

SCALES = ((64, "<=64"), (512, "<=512"), (None, ">512"))
# GPU architecture of the GPU presets (NVIDIA datasheets): a family of the same architecture is nearer.
ARCHITECTURES = {"a100-40gb": "ampere", "a100-80gb": "ampere", "h100-sxm": "hopper", "h800-sxm": "hopper",
                 "h200-sxm": "hopper", "b200": "blackwell", "gb200": "blackwell"}
BANDS_FILE = "error_bands.json"


def scale_of(num_gpus: int) -> str:
    for limit, label in SCALES:
        if limit is None or num_gpus <= limit:
            return label
    raise AssertionError


def family(gpu: str, moe: bool, fp8: bool, num_gpus: int) -> dict:
    return {"gpu": gpu, "kind": "moe" if moe else "dense", "precision": "fp8" if fp8 else "bf16",
            "scale": scale_of(num_gpus)}


def family_key(f: dict) -> str:
    return f"{f['gpu']}/{f['kind']}/{f['precision']}/{f['scale']}"


def _summary(errors: list[float]) -> dict:
    return {"n_runs": len(errors), "mean_abs_error_pct": sum(abs(e) for e in errors) / len(errors),
            "mean_signed_error_pct": sum(errors) / len(errors), "max_abs_error_pct": max(abs(e) for e in errors),
            "min_signed_error_pct": min(errors), "max_signed_error_pct": max(errors)}


def measured_ratio_range(band: dict) -> tuple[float, float]:
    """Measured / predicted step time over the band's validated runs, lowest and highest.

    A signed error e (predicted - measured, in % of measured) is a measured / predicted ratio of
    1 / (1 + e / 100): a family predicted too fast (e < 0) ran slower than predicted, and its range lies
    above 1 rather than around it. A table without the signed extremes falls back to 1 -/+ the mean
    absolute error."""
    if "min_signed_error_pct" not in band:
        rel = band["mean_abs_error_pct"] / 100.0
        return 1.0 - rel, 1.0 + rel
    return 1.0 / (1.0 + band["max_signed_error_pct"] / 100.0), 1.0 / (1.0 + band["min_signed_error_pct"] / 100.0)


def band_summary(band: dict) -> dict:
    """What a result carries of its band (``band_for``'s answer): family, match, note, run count, mean absolute
    and mean signed error, the measured / predicted range and its text."""
    return {**{k: band[k] for k in ("family", "match", "note", "n_runs", "mean_abs_error_pct", "mean_signed_error_pct")},
            "measured_over_predicted": list(measured_ratio_range(band)), "text": band_text(band)}


def band_text(band: dict) -> str:
    """"+6..+18% (n=5)": how much longer (or shorter) the family's validated runs took than predicted."""
    lo, hi = (100.0 * (r - 1.0) for r in measured_ratio_range(band))
    span = f"{lo:+.0f}%" if round(lo) == round(hi) else f"{lo:+.0f}..{hi:+.0f}%"
    return f"{span} (n={band['n_runs']})"


def build_bands(paths: list[str]) -> dict:
    """Validate every row of the runs CSVs and summarise the errors by family."""
    from echo_tune.validate.compare import simulate_case
    from echo_tune.validate.runs import read_runs

    by_family: dict[str, list[float]] = {}
    families: dict[str, dict] = {}
    every: list[float] = []
    for path in paths:
        for case in read_runs(path):
            result = simulate_case(case)
            if result.error_pct is None or case.cluster is None:
                continue
            fam = family(case.cluster.gpu.name, case.model.is_moe, case.parallel.fp8_format is not None, case.num_gpus)
            key = family_key(fam)
            families[key] = fam
            by_family.setdefault(key, []).append(result.error_pct)
            every.append(result.error_pct)
    return {"command": "python -m echo_tune.plan.bands " + " ".join(str(p) for p in paths),
            "sources": [Path(p).name for p in paths],
            "families": {k: {**families[k], **_summary(v)} for k, v in sorted(by_family.items())},
            "all": _summary(every)}


def load_bands() -> dict:
    return json.loads(resources.files("echo_tune.plan").joinpath(BANDS_FILE).read_text())


def band_for(gpu: str, moe: bool, fp8: bool, num_gpus: int, bands: dict | None = None) -> dict:
    """The error band of a prediction: its family's, else the nearest validated one, else all rows (flagged)."""
    bands = bands or load_bands()
    want = family(gpu, moe, fp8, num_gpus)
    fams = bands["families"]
    key = family_key(want)
    if key in fams:
        return {**fams[key], "family": key, "match": "exact", "note": f"validated family {key}"}
    arch = ARCHITECTURES.get(gpu)
    for f in fams.values():
        f.setdefault("arch", ARCHITECTURES.get(f["gpu"]))
    want["arch"] = arch
    tiers = (("gpu", "kind", "precision"), ("arch", "kind", "precision"), ("kind", "precision"))
    order = [label for _, label in SCALES]
    for fields in tiers:
        near = [k for k, f in fams.items() if all(f[x] == want[x] for x in fields)]
        if near:
            near.sort(key=lambda k: (abs(order.index(fams[k]["scale"]) - order.index(want["scale"])),
                                     -fams[k]["n_runs"], k))
            best = near[0]
            return {**fams[best], "family": best, "match": "nearest",
                    "note": f"no validated run of {key}; nearest validated family {best}"}
    return {**bands["all"], "family": "all", "match": "outside",
            "note": f"{key} is outside every validated family; band of all {bands['all']['n_runs']} validated runs"}


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m echo_tune.plan.bands RUNS.csv [RUNS.csv ...]\n")
        return 2
    data = build_bands(argv)
    out = Path(__file__).with_name(BANDS_FILE)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}: {len(data['families'])} families from {data['all']['n_runs']} runs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
