"""Error bands: how far the simulator's step times were from measured runs of the same *family*, out of sample.

A family is (GPU, kind: dense, MoE or coarse MoE (at most 8 experts), precision: bf16, fp8 or fp4 (NVFP4), scale:
GPUs up to 64, up to 512, or more). The table ``error_bands.json`` beside this module is built from ``echo-tune
validate``'s rows on the developers' sets (``validate/datasets.py DATASETS``) by::

    python -m echo_tune.plan.bands calibration/published-runs/runs_megatron.csv \
        calibration/published-runs/runs_modern.csv calibration/published-runs/runs_bridge.csv \
        calibration/published-runs/runs_bridge_2025.csv calibration/collected-runs/runs_bridge_prs.csv

(the command and the simulator's version are stored in the file).

Sign convention, everywhere (README table, ``validate``, bands): the prediction error e = (predicted - measured)
/ measured in percent; negative = predicted too fast. A band says which errors the family's runs had.

Out of sample only: a row that a shipped fit was fitted on (the default host time per kernel, fitted on the H100
and B200 rows, ``cost/host/host_time.py``) counts with its leave-one-source-out error (a fit that never saw the row's source
predicts it; the fit file stores it per row), every other row with its plain error.

The band of a family of at least ``MIN_RUNS`` runs is the 5th..95th percentile of its errors, without its one run
farthest from the median where it has five or more (one outlier row does not set the band), never narrower than the
typical error of all runs (their median absolute error, ``min_half_width_pct``, on each side of the family's median).
A prediction takes its own family's band where it has ``MIN_RUNS`` runs; else the runs of its GPU and kind together
(``pooled``: every precision and scale, its own family's runs among them), where they are ``MIN_RUNS``; else it is
*unvalidated* and gets the band of all runs, said so; a pooled or unvalidated band is widened to cover its own
family's runs (the nearest runs are never trimmed as an outlier). Every band also covers what its runs (a pooled
band's: the pool's; an unvalidated one's: its own family's) erred with the host time per kernel at 0, scaled to the
share of this prediction's step the fitted host time carries (``plan/host_share.py``): a layout that leans less on
that fit than its validated runs did does not inherit their agreement. No band is borrowed from another family alone
(a narrow band of another precision or scale), another GPU or another kind, and a MoE prediction on a GPU with no
validated MoE run says so. Coarse MoE is a kind of its own (``kind_of``): the model's MoE error grows with many
small experts per rank, and 8-expert runs (Grok-1 on H100: -6..-12%) say nothing of a 128-expert model's
(Qwen3-30B-A3B on H100: -43% in sample, +14% and +116% out of sample).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
import hashlib

from echo_tune.code_version import code_version
from echo_tune.config.load.loading import preset_names  # what the table was computed by (plan.planner reads it here)
from echo_tune.cost.profile import default_profile
from echo_tune.plan.anchors import anchor_run
from echo_tune.plan.bands_table import BANDS_FILE, load_bands
from echo_tune.plan.host_share import gpu_side_floor, gpu_side_low_pct, share_of
from echo_tune.validate.compare import simulate_case, simulate_gpu_side
from echo_tune.validate.errata import errata_path_for
from echo_tune.validate.held_out import out_of_sample_errors
from echo_tune.validate.runs import read_runs

SCALES = ((64, "<=64"), (512, "<=512"), (None, ">512"))


def scale_of(num_gpus: int) -> str:
    for limit, label in SCALES:
        if limit is None or num_gpus <= limit:
            return label
    raise AssertionError


COARSE_MOE_EXPERTS = 8
"""MoE models with at most this many experts (Mixtral 8x7B, Grok-1: top-2 of 8 large experts, one or two per rank)
are "moe-coarse"; more experts (Qwen3, DeepSeek-V3, GPT-OSS: 128-256 small ones, a GEMM, a quantisation and a launch
per local expert, the host-bound regime of docs/moe.md) are "moe". No published row lies between 8 and 128."""
KIND_NAMES = {"dense": "dense", "moe": "MoE", "moe-coarse": f"coarse MoE (<= {COARSE_MOE_EXPERTS} experts)"}


def kind_of(model) -> str:
    """The band kind of a model: dense, moe or moe-coarse (``COARSE_MOE_EXPERTS``)."""
    if not model.is_moe:
        return "dense"
    return "moe-coarse" if model.num_experts <= COARSE_MOE_EXPERTS else "moe"


def family(gpu: str, kind: str, fp8: bool | str, num_gpus: int) -> dict:
    """``kind``: ``kind_of`` the model; ``fp8``: whether the linears run in FP8, or the precision by name ("bf16",
    "fp8", "fp4": NVFP4)."""
    if kind not in KIND_NAMES:
        raise ValueError(f"`kind` must be one of {sorted(KIND_NAMES)}, but got (kind={kind!r})")
    precision = fp8 if isinstance(fp8, str) else ("fp8" if fp8 else "bf16")
    return {"gpu": gpu, "kind": kind, "precision": precision, "scale": scale_of(num_gpus)}


def precision_of(parallel) -> str:
    """The band precision of a layout: fp4 (NVFP4), fp8 or bf16."""
    return "fp4" if getattr(parallel, "fp4_format", None) else ("fp8" if parallel.fp8_format else "bf16")


def family_key(f: dict) -> str:
    return f"{f['gpu']}/{f['kind']}/{f['precision']}/{f['scale']}"


def pool_key(f: dict) -> str:
    """The runs of one GPU and kind, every precision and scale together (the last fallback before unvalidated)."""
    return f"{f['gpu']}/{f['kind']}/all"


MIN_RUNS = 3
"""A family (or a GPU and kind's pooled runs) with fewer validated runs gives no band of its own (``band_for``)."""
QUANTILES = (0.05, 0.95)
"""The band of a family: these quantiles of its runs' errors (linear interpolation between ranks)."""
TRIM_FROM_RUNS = 5
"""A family of this many runs or more leaves out its one run farthest from its median before the quantiles."""


SAID_WIDENING_PCT = 5.0
"""A band widened for its host share by more than this many points says why in its note (less is widened silently)."""


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    i = int(pos)
    return ordered[i] + (ordered[min(i + 1, len(ordered) - 1)] - ordered[i]) * (pos - i)


def _summary(errors: list[float], min_half_width: float | None = None, gpu_side: list[float] | None = None,
             shares: list[float] | None = None) -> dict:
    """A family's numbers; its band (``band_lo_pct`` .. ``band_hi_pct``): the quantiles of its errors (without the
    one farthest from the median, from ``TRIM_FROM_RUNS`` runs), widened to at least ``min_half_width`` on each side
    of the median. ``gpu_side``: the runs' errors with the host time per kernel at 0, ``shares`` their host shares
    (plan/host_share.py), kept as pairs for ``gpu_side_floor``."""
    median = _quantile(errors, 0.5)
    rest = list(errors)
    if len(rest) >= TRIM_FROM_RUNS:  # one outlier row does not set the band
        rest.remove(max(rest, key=lambda e: abs(e - median)))
    lo, hi = (_quantile(rest, q) for q in QUANTILES)
    if min_half_width is not None:
        lo, hi = min(lo, median - min_half_width), max(hi, median + min_half_width)
    return {"n_runs": len(errors), "mean_abs_error_pct": sum(abs(e) for e in errors) / len(errors),
            "mean_signed_error_pct": sum(errors) / len(errors), "max_abs_error_pct": max(abs(e) for e in errors),
            "min_signed_error_pct": min(errors), "max_signed_error_pct": max(errors),
            "median_signed_error_pct": median, "band_lo_pct": lo, "band_hi_pct": hi,
            **({"gpu_side_min_signed_error_pct": min(gpu_side)} if gpu_side else {}),
            **({"gpu_side_by_host_share": [[round(h, 4), round(g, 3)] for h, g in sorted(zip(shares, gpu_side))]}
               if gpu_side and shares else {})}


def median_ratio(band: dict) -> float:
    """Median measured / predicted step time of the band's runs: 1 / (1 + e / 100) of the median error."""
    e = band.get("median_signed_error_pct", band.get("mean_signed_error_pct", 0.0))
    return 1.0 / (1.0 + e / 100.0)


def measured_ratio_range(band: dict) -> tuple[float, float]:
    """Measured / predicted step time over the band, lowest and highest: an error e is a ratio of
    1 / (1 + e / 100), so a family predicted too fast (e < 0) lies above 1."""
    return 1.0 / (1.0 + band["band_hi_pct"] / 100.0), 1.0 / (1.0 + band["band_lo_pct"] / 100.0)


def band_summary(band: dict) -> dict:
    """What a result carries of its band (``band_for``'s answer): family, match, note, run count, errors, the band
    in prediction error and as measured / predicted, and its text."""
    return {**{k: band[k] for k in ("family", "match", "note", "n_runs", "mean_abs_error_pct", "mean_signed_error_pct")},
            "validated": band["match"] in ("exact", "pooled"),
            "widened_for_host_share": bool(band.get("gpu_side_widened")),
            "prediction_error_pct": [band["band_lo_pct"], band["band_hi_pct"]],
            "median_measured_over_predicted": median_ratio(band),
            "measured_over_predicted": list(measured_ratio_range(band)), "text": band_text(band)}


def band_text(band: dict) -> str:
    """"-5% (-12..+3%, n=8)": the prediction error of the family's runs (predicted - measured, out of sample),
    the median, then the band; "unvalidated: ..." where the band is all runs'."""
    median = band.get("median_signed_error_pct", band.get("mean_signed_error_pct", 0.0))
    body = f"{median:+.0f}% ({band['band_lo_pct']:+.0f}..{band['band_hi_pct']:+.0f}%, n={band['n_runs']})"
    return f"unvalidated: all runs {body}" if band.get("match") == "unvalidated" else body


def inputs_sha256(paths: list[str]) -> dict[str, str]:
    """SHA-256 of each runs CSV and of its errata file (``validate/errata/<stem>.yaml``), by file name."""
    files = [Path(p) for p in paths] + [e for e in (errata_path_for(p) for p in paths) if e is not None]
    return {(f"errata/{f.name}" if f.suffix == ".yaml" else f.name): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in files}


def build_bands(paths: list[str]) -> dict:
    """Validate every row of the runs CSVs and summarise the out-of-sample errors by family."""
    simulated = [(case, simulate_case(case)) for path in paths for case in read_runs(path)]
    simulated = [(c, r) for c, r in simulated if r.error_pct is not None and c.cluster is not None]
    errors = out_of_sample_errors(simulated)
    # per run: its out-of-sample error, its GPU side alone, and the host share of its own two predictions
    runs = [(error, gpu, share_of(1.0 + r.error_pct / 100.0, 1.0 + gpu / 100.0))
            for (_, r), error, gpu in zip(simulated, errors, (simulate_gpu_side(c).error_pct for c, _ in simulated))]
    by_family: dict[str, list[tuple[float, float, float]]] = {}
    families: dict[str, dict] = {}
    for (case, _), run in zip(simulated, runs):
        fam = family(case.cluster.gpu.name, kind_of(case.model), precision_of(case.parallel), case.num_gpus)
        families[family_key(fam)] = fam
        by_family.setdefault(family_key(fam), []).append(run)
    min_half_width = _quantile([abs(e) for e in errors], 0.5)
    pooled: dict[str, list[tuple[float, float, float]]] = {}
    for key, members in by_family.items():
        pooled.setdefault(pool_key(families[key]), []).extend(members)

    def summary(members: list[tuple[float, float, float]]) -> dict:
        errs, gpu_side, shares = (list(column) for column in zip(*members))
        return _summary(errs, min_half_width, gpu_side, shares)

    return {"command": "python -m echo_tune.plan.bands " + " ".join(str(p) for p in paths),
            "sources": [Path(p).name for p in paths], "inputs_sha256": inputs_sha256(paths),
            "code": code_version(), "min_half_width_pct": min_half_width,
            "families": {k: {**families[k], **summary(v)} for k, v in sorted(by_family.items())},
            "pooled": {k: summary(v) for k, v in sorted(pooled.items())},
            "all": _summary(errors),
            "runs": [anchor_run(case, error) for (case, _), error in zip(simulated, errors)]}


def band_applies(profile, cluster) -> bool:
    """The bands were measured with each cluster's datasheet profile (``cost/profile.py default_profile``): a
    measured, CPU-fitted or runs-fitted profile (or an op-time database) is not what they validated."""
    return profile is None or profile == default_profile(cluster)


def no_band(note: str) -> dict:
    """What a result carries where no band applies (``band_summary``'s keys, no numbers)."""
    return {"family": None, "match": "none", "n_runs": 0, "mean_abs_error_pct": None, "mean_signed_error_pct": None,
            "validated": False, "widened_for_host_share": False, "prediction_error_pct": None,
            "median_measured_over_predicted": None, "measured_over_predicted": None, "text": "-", "note": note}


def band_or_none(profile, cluster, kind: str, fp8: bool | str, num_gpus: int,
                 host_share: Callable[[], float] | None = None) -> dict:
    """``band_summary`` of the prediction's family where a band applies, else ``no_band``: the profile must be
    the datasheet one the bands validated, and the GPU one of the GPU presets; a user-described device (a CPU
    "cluster", a GPU not among the presets) gets none rather than another GPU's band. ``host_share``: computes the
    prediction's host share (plan/host_share.py, a second simulation), called only where a band applies."""
    if not band_applies(profile, cluster):
        return no_band(f"no error band: profile {profile.name!r} is not the datasheet profile the bands were "
                       f"validated with; its own fit error applies")
    gpus = preset_names("gpus")
    if cluster.gpu.name not in gpus:
        return no_band(f"no error band: {cluster.gpu.name!r} is not a GPU preset ({', '.join(gpus)}); "
                       f"no validated run speaks for it")
    share = None if host_share is None else host_share()
    return band_summary(band_for(cluster.gpu.name, kind, fp8, num_gpus, host_share=share))


def band_note(band: dict) -> str | None:
    """The table note of a band that is not its family's own or was widened for its host share, or None."""
    if band.get("widened_for_host_share"):
        return band["note"]
    return {"pooled": band["note"],
            "unvalidated": band["note"], "none": band["note"]}.get(band["match"])


def band_for(gpu: str, kind: str, fp8: bool | str, num_gpus: int, bands: dict | None = None,
             host_share: float | None = None) -> dict:
    """The error band of a prediction: its family's with at least ``MIN_RUNS`` runs, else the runs of its GPU and kind
    together (every precision and scale) where they are ``MIN_RUNS``, else unvalidated (all runs). A pooled or
    unvalidated band covers its own family's runs; with ``host_share`` (plan/host_share.py) every band covers the
    error its runs had on their GPU side alone, scaled to that share."""
    bands = bands or load_bands()
    want = family(gpu, kind, fp8, num_gpus)
    fams, key = bands["families"], family_key(want)
    own = fams.get(key)
    if own is not None and own["n_runs"] >= MIN_RUNS:
        band = {**own, "family": key, "match": "exact", "note": f"validated family {key}"}
    elif bands.get("pooled", {}).get(pool_key(want), {}).get("n_runs", 0) >= MIN_RUNS:
        pool = pool_key(want)
        band = {**bands["pooled"][pool], "family": pool, "match": "pooled"}
        band["note"] = (f"{_own_runs(own, key)}; band of the {band['n_runs']} runs of {pool} (same GPU and kind, every "
                        f"precision and scale){_cover(band, own)}")
    else:
        name = KIND_NAMES[kind]
        seen = sum(f["n_runs"] for f in fams.values() if f["gpu"] == gpu and f["kind"] == want["kind"])
        why = (f"only {seen} validated {name} run(s) on {gpu}" if seen else f"no validated {name} run on {gpu}")
        band = {**bands["all"], "family": "all", "match": "unvalidated"}
        band["note"] = (f"unvalidated: {why} (fewer than {MIN_RUNS} in any family); band of all "
                        f"{bands['all']['n_runs']} validated runs{_cover(band, own)}")
    # the runs the band is of (a pooled band: the pool's; an unvalidated one: its own family's, if any)
    runs, runs_key = (bands["pooled"][band["family"]], band["family"]) if band["match"] == "pooled" else (own, key)
    if host_share is not None and runs is not None and "gpu_side_min_signed_error_pct" in runs:
        pool = pool_key(want)
        worst, which = gpu_side_floor(runs, host_share, MIN_RUNS, runs_key, bands.get("pooled", {}).get(pool), pool)
        low = gpu_side_low_pct(worst, host_share)
        if low < band["band_lo_pct"] - SAID_WIDENING_PCT:
            band["gpu_side_widened"] = True
            band["note"] += (f"; low end {low:+.0f}%: the host time per kernel carries {host_share:.0%} of this step, "
                             f"and the GPU side alone of {which} erred down to {worst:+.0f}% (plan/host_share.py)")
        band["band_lo_pct"] = min(low, band["band_lo_pct"])
    return band


def _own_runs(own: dict | None, key: str) -> str:
    if own is None:
        return f"no validated run of {key}"
    return f"{own['n_runs']} validated run(s) of {key}"


def _cover(band: dict, own: dict | None) -> str:
    """Widen ``band`` in place to cover its own family's runs (the nearest runs are never trimmed as the band's
    outlier); what to add to its note."""
    if own is None:
        return ""
    lo, hi = own["min_signed_error_pct"], own["max_signed_error_pct"]
    if lo >= band["band_lo_pct"] and hi <= band["band_hi_pct"]:
        return ""
    band.update(band_lo_pct=min(lo, band["band_lo_pct"]), band_hi_pct=max(hi, band["band_hi_pct"]))
    return f", widened to cover its own family's runs ({lo:+.0f}..{hi:+.0f}%)"


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
