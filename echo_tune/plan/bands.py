"""Error bands: how far the simulator's step times were from measured runs of the same *family*.

A family is (GPU, dense or MoE, precision: bf16 or fp8, scale: GPUs up to 64, up to 512, or more). The
table ``error_bands.json`` beside this module is built from ``echo-tune validate``'s rows on the shipped
published-runs CSVs by::

    python -m echo_tune.plan.bands calibration/published-runs/runs_megatron.csv \
        calibration/published-runs/runs_modern.csv calibration/published-runs/runs_bridge.csv

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

from echo_tune.code_version import code_version  # what the table was computed by (plan.planner reads it here)

SCALES = ((64, "<=64"), (512, "<=512"), (None, ">512"))
# GPU architecture of the GPU presets (NVIDIA datasheets): a family of the same architecture is nearer.
ARCHITECTURES = {"a100-40gb": "ampere", "a100-80gb": "ampere", "h100-sxm": "hopper", "h800-sxm": "hopper",
                 "h200-sxm": "hopper", "b200": "blackwell", "gb200": "blackwell",
                 "gb300": "blackwell"}
BANDS_FILE = "error_bands.json"  # left out of the sources digest (code_version.DIGEST_EXCLUDES)


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


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _summary(errors: list[float]) -> dict:
    return {"n_runs": len(errors), "mean_abs_error_pct": sum(abs(e) for e in errors) / len(errors),
            "mean_signed_error_pct": sum(errors) / len(errors), "max_abs_error_pct": max(abs(e) for e in errors),
            "min_signed_error_pct": min(errors), "max_signed_error_pct": max(errors),
            "median_signed_error_pct": _median(errors)}


def median_ratio(band: dict) -> float:
    """Median measured / predicted step time of the band's runs: 1 / (1 + e / 100) of the median signed error
    (the ratio is monotone in e, so it is the median ratio); a table without the median uses the mean."""
    e = band.get("median_signed_error_pct", band.get("mean_signed_error_pct", 0.0))
    return 1.0 / (1.0 + e / 100.0)


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
            "median_measured_over_predicted": median_ratio(band),
            "measured_over_predicted": list(measured_ratio_range(band)), "text": band_text(band)}


def band_text(band: dict) -> str:
    """"+12% (+6..+18%, n=5)": how much longer (or shorter) the family's validated runs took than predicted,
    the median first, then the lowest..highest."""
    lo, hi = (100.0 * (r - 1.0) for r in measured_ratio_range(band))
    if round(lo) == round(hi):
        return f"{lo:+.0f}% (n={band['n_runs']})"
    return f"{100.0 * (median_ratio(band) - 1.0):+.0f}% ({lo:+.0f}..{hi:+.0f}%, n={band['n_runs']})"


def inputs_sha256(paths: list[str]) -> dict[str, str]:
    """SHA-256 of each runs CSV and of its errata file (``validate/errata/<stem>.yaml``), by file name."""
    import hashlib

    from echo_tune.validate.errata import errata_path_for

    files = [Path(p) for p in paths] + [e for e in (errata_path_for(p) for p in paths) if e is not None]
    return {(f"errata/{f.name}" if f.suffix == ".yaml" else f.name): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in files}


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
            "sources": [Path(p).name for p in paths], "inputs_sha256": inputs_sha256(paths),
            "code": code_version(),
            "families": {k: {**families[k], **_summary(v)} for k, v in sorted(by_family.items())},
            "all": _summary(every)}


def band_applies(profile, cluster) -> bool:
    """The bands were measured with each cluster's datasheet profile (``cost/profile.py default_profile``): a
    measured, CPU-fitted or runs-fitted profile (or an op-time database) is not what they validated."""
    from echo_tune.cost.profile import default_profile

    return profile is None or profile == default_profile(cluster)


def no_band(note: str) -> dict:
    """What a result carries where no band applies (``band_summary``'s keys, no numbers)."""
    return {"family": None, "match": "none", "n_runs": 0, "mean_abs_error_pct": None, "mean_signed_error_pct": None,
            "median_measured_over_predicted": None, "measured_over_predicted": None, "text": "-", "note": note}


def band_or_none(profile, cluster, moe: bool, fp8: bool, num_gpus: int) -> dict:
    """``band_summary`` of the prediction's family where a band applies, else ``no_band``: the profile must be
    the datasheet one the bands validated, and the GPU one of the GPU presets (whose architecture a validated
    family shares or neighbours); a user-described device (a CPU "cluster", a GPU not among the presets) gets
    none rather than another GPU's band."""
    if not band_applies(profile, cluster):
        return no_band(f"no error band: profile {profile.name!r} is not the datasheet profile the bands were "
                       f"validated with; its own fit error applies")
    if cluster.gpu.name not in ARCHITECTURES:
        return no_band(f"no error band: {cluster.gpu.name!r} is not a GPU preset ({', '.join(sorted(ARCHITECTURES))}); "
                       f"no validated run speaks for it")
    return band_summary(band_for(cluster.gpu.name, moe, fp8, num_gpus))


def band_note(band: dict) -> str | None:
    """The table note of a band that is not its family's own, or None."""
    return {"nearest": f"band of nearest validated family {band['family']}",
            "outside": "outside every validated family (band of all runs)",
            "none": band["note"]}.get(band["match"])


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
