"""Safety in the answer: a near-tie that leaves much more memory free, and what would fit an infeasible candidate.

- ``near_tie``: the simulator's error band is a few percent wide, so a winner that peaks at the memory limit
  is a risky booking when a layout within ``pct`` percent of its step time leaves much more memory free
  (at least ``NEAR_TIE_MIN_EXTRA_GIB`` more). Such a layout is named beside the winner.
- ``fit_hint``: for a candidate whose every layout overflows memory, the closest miss re-simulated with
  2x, 4x and 8x the GPUs (its pipeline or data-parallel size scaled; not searched), and the GPU presets whose
  memory would hold the closest miss as it is (the same layout needs the same bytes per GPU on any part).
- ``promote_over_limit_rows`` / ``just_over``: a layout predicted over its limit by less than the memory model's
  measured over-prediction (``sim/memory_band.over_limit_risk``) may still fit: ``plan`` and ``rank`` show it "at
  risk" with its throughput, time and cost instead of "does not fit" (the search's band keeps "does not fit";
  this is the planner's reading of it).
"""

from __future__ import annotations

import dataclasses

from echo_tune.config.load.loading import load_gpu, preset_names
from echo_tune.errors import ConfigError
from echo_tune.plan.projection import project, sort_rows
from echo_tune.search.space.dominance import variants_near_best
from echo_tune.search.space.labels import full_label
from echo_tune.search.outputs.results import candidate_of, entry
from echo_tune.search.space.search_space import space_profile
from echo_tune.sim.memory.memory_band import over_beyond_error, over_limit_risk
from echo_tune.sim.simulate import simulate

GIB = 2**30
NEAR_TIE_MIN_EXTRA_GIB = 4.0
"""'Much more memory free': at least this many GiB more than the winner leaves (about 5% of an 80 GB part,
the size of one layer's activations of a 70B model at micro-batch 1)."""
SCALE_FACTORS = (2, 4, 8)
def free_gib(record: dict) -> float:
    """GiB left under the limit (HBM less the required headroom) at the record's peak stage."""
    return (record["memory_capacity_bytes"] - record["peak_memory_bytes"]) / GIB


def near_tie(records: list[dict], pct: float, space=None) -> dict | None:
    """The feasible layout within ``pct`` percent of the fastest one's step time that leaves the most memory
    free, when that is at least NEAR_TIE_MIN_EXTRA_GIB more than the fastest leaves; None otherwise. ``space``:
    the search space of ``records``, whose recompute variants the search skipped near the best are simulated
    and considered too (``search.dominance.variants_near_best``)."""
    if not pct >= 0:
        raise ConfigError(f"`--near-tie-pct >= 0` must hold, but got ({pct})")
    if space is not None:
        records = records + variants_near_best(space, records, pct)
    ok = [r for r in records if r["fits_memory"]]
    if not ok:
        return None
    best = min(ok, key=lambda r: r["step_time_s"])
    close = [r for r in ok if r["step_time_s"] <= best["step_time_s"] * (1 + pct / 100)]
    safer = max(close, key=lambda r: (free_gib(r), -r["step_time_s"]))
    if free_gib(safer) - free_gib(best) < NEAR_TIE_MIN_EXTRA_GIB:
        return None
    return {"layout": full_label(safer["config"], safer["derived"].get("data_parallel_size")),
            "config": safer["config"], "step_time_s": safer["step_time_s"],
            "slower_pct": 100 * (safer["step_time_s"] / best["step_time_s"] - 1),
            "free_gib": free_gib(safer), "winner_free_gib": free_gib(best),
            "winner_peak_gib": best["peak_memory_bytes"] / GIB, "limit_gib": best["memory_capacity_bytes"] / GIB,
            "megatron_args": safer.get("megatron_args")}


def near_tie_text(tie: dict, pct: float) -> str:
    return (f"safer near-tie: the fastest layout peaks at {tie['winner_peak_gib']:.1f} of {tie['limit_gib']:.1f} GiB "
            f"allowed ({tie['winner_free_gib']:.1f} GiB spare); {tie['layout']} is {tie['slower_pct']:.1f}% slower "
            f"(within {pct:g}%) and leaves {tie['free_gib']:.1f} GiB spare under that limit")


def _scaled(parallel, model, k: int):
    """The layout on k times the GPUs: k times the pipeline stages where the layers allow, else k times the
    data-parallel size (the same micro-batch count per replica shrinks; the global batch stays)."""
    pp = parallel.pipeline_model_parallel_size
    out = []
    if model.num_layers % (pp * k) == 0 and parallel.decoder_first_pipeline_num_layers is None \
            and parallel.decoder_last_pipeline_num_layers is None:
        out.append(dataclasses.replace(parallel, pipeline_model_parallel_size=pp * k,
                                       virtual_pipeline_model_parallel_size=None))
    out.append(parallel)  # same sizes: the data-parallel size takes the new GPUs
    return out


def fit_hint(space, miss_record: dict) -> dict:
    """What would hold the closest miss: more GPUs of this part (re-simulated) and other GPU presets."""
    peak = miss_record["peak_memory_bytes"]
    headroom = int(space.memory_headroom_gib * GIB)
    parts = sorted((name for name in preset_names("gpus") if load_gpu(name).memory_bytes - headroom >= peak),
                   key=lambda name: (load_gpu(name).memory_bytes, name))
    more = None
    cand = candidate_of(space, miss_record)
    for k in SCALE_FACTORS:
        for parallel in _scaled(cand.parallel, cand.model, k):
            try:
                report = simulate(cand.model, space.cluster, cand.num_gpus * k, parallel,
                                  memory_headroom_bytes=headroom)
            except ConfigError:
                continue  # the global batch does not divide over the larger data-parallel size, ...
            if report.fits_memory:
                more = {"num_gpus": cand.num_gpus * k, "peak_gib": report.peak_memory_bytes / GIB,
                        "layout": full_label({**parallel.to_dict(), "num_gpus": cand.num_gpus * k},
                                             report.config.get("data_parallel_size"))}
                break
        if more:
            break
    return {"need_gib": peak / GIB, "limit_gib": miss_record["memory_capacity_bytes"] / GIB,
            "parts": parts, "more_gpus": more}


def _gib(value: float) -> str:
    return f"{value:.2f}" if value < 10 else f"{value:.1f}"


def fit_hint_text(hint: dict, cluster_gpu: str) -> str:
    text = f"needs {_gib(hint['need_gib'])} GiB per GPU, {_gib(hint['limit_gib'])} allowed"
    options = []
    if hint["more_gpus"]:
        m = hint["more_gpus"]
        sizes = " ".join(t for t in m["layout"].split(" mbs")[0].split() if t[:2] in ("TP", "PP", "CP", "EP")
                         and not (t[:2] in ("CP", "EP") and t[2:] == "1"))
        options.append(f"{m['num_gpus']} x {cluster_gpu} ({sizes}, peak {_gib(m['peak_gib'])} GiB; simulated, "
                       f"not searched)")
    if hint["parts"]:
        few = hint["parts"][:3]
        options.append(f"this layout on {', '.join(few)}" + (" or larger" if len(hint["parts"]) > 3 else ""))
    return text + ("; fits: " + " or ".join(options) if options else
                   f"; no more GPUs (up to {SCALE_FACTORS[-1]}x) or larger part holds it")


def row_over_limit_risk(row: dict) -> str | None:
    """``over_limit_risk`` of a simulate report's dict (``StepReport.to_dict``: peak, limit, stages' reserves)."""
    if row.get("fits_memory", True):
        return None
    reserve = max((s.get("reserve_bytes", 0) for s in row.get("stage_memory_bytes") or ()), default=0)
    return over_limit_risk(int(row["peak_memory_bytes"]), int(reserve), int(row["memory_capacity_bytes"]))


def promote_over_limit_rows(rows: list[dict], tokens: float, *, sort: str = "time", goodput: float,
                            deadline_days: float | None) -> list[dict]:
    """``rank``'s rows with the ones over their limit by less than the model's over-prediction made "at risk":
    time, GPU-hours and cost as a fitting row's (plan/projection.py), ``feasible`` True, sorted and ranked again
    (``fits_memory`` stays the simulator's False)."""
    ranked = [r for r in rows if not r.get("refused")]
    for r in ranked:
        verdict = row_over_limit_risk(r)
        if verdict is None:
            continue
        seconds = tokens / r["tokens_per_s"]
        proj = project(seconds, r["error_band"], num_gpus=r["config"]["num_gpus"], gpu_hour_price=r["gpu_hour_cost"],
                       deadline_days=deadline_days, goodput=goodput)
        r.update(memory_band="at risk", memory_verdict=verdict, over_limit_at_risk=True, feasible=True,
                 time_to_train_s=seconds, time_to_train_days=proj["days"], days=proj["days"],
                 gpu_hours=proj["gpu_hours"], cost=proj["cost"],
                 **{k: proj.get(k) for k in ("days_band", "gpu_hours_band", "cost_band", "goodput", "deadline")})
    ranked = sort_rows(ranked, sort)
    for i, r in enumerate(ranked, 1):
        r["rank"] = i
    return ranked + [r for r in rows if r.get("refused")]


def just_over(space, records: list[dict]) -> dict | None:
    """Where no layout fits by the search's rule, the fastest "at risk" one, as a best entry: first one that fits as
    predicted but by less than the memory band's margin (a search without a headroom given counts those as not
    fitting: search/engines/objective.py ``safe_memory``), else one over its limit by less than the memory model's
    over-prediction (``over_limit_risk``, flagged ``over_limit_at_risk``); None when there is neither. Both are flagged
    ``fallback_at_risk``: the planner recommends one only where no candidate has a layout the search kept."""
    missed = [r for r in records if not r["fits_memory"]]
    within = [r for r in missed if r["peak_memory_bytes"] <= r["memory_capacity_bytes"]]
    over = [r for r in missed if r["peak_memory_bytes"] > r["memory_capacity_bytes"]
            and not over_beyond_error(r["peak_memory_bytes"], r["memory_capacity_bytes"])]  # the reserve only narrows
    # it (checked below); the search left those further over untimed (search/space/dominance.py)
    for group in (within, over):
        for record in sorted(group, key=lambda r: r["step_time_s"]):
            best = entry(space, -1, record, profile=space_profile(space))
            if best["fits_memory"]:  # its own band: "at risk" (it fits by less than the margin)
                return {**best, "fallback_at_risk": True}
            verdict = row_over_limit_risk(best)
            if verdict is not None:
                return {**best, "memory_band": "at risk", "memory_verdict": verdict, "over_limit_at_risk": True,
                        "fallback_at_risk": True}
    return None
