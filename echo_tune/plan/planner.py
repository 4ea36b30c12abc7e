"""``plan``: search each candidate cluster for its best layout, then price the token budget on each.

A candidate is a cluster (preset or file), a GPU count and optionally the price of one GPU-hour. Each is
searched with the zero-YAML space (``search/space/auto_space.py``) in its own study under
``RESULTS_DIR/plan-<model>-<gpus>x<cluster>-gbs<G>/``; a finished study is reused (resumed: only missing
trials run). The row of a candidate holds its best layout's step time, tokens/s, MFU, memory headroom, days,
GPU-hours, cost and the error band of its validated family; a candidate whose every layout overflows memory
is shown as infeasible with the closest miss, what would hold it (more GPUs of the part, or a larger part:
``plan/safety.py``) and no time or cost, unless a layout is over its limit by less than the memory model's
over-prediction: that one is "at risk" with its time and cost (``safety.just_over``). Every candidate is checked
(its space built) before any is searched; one that cannot be planned is a row with its reason, after the others.

A candidate may name its precision (``h100:256:2.49:fp8``: BF16 and FP8 hybrid searched, the faster wins;
``bf16``, ``hybrid`` or ``e4m3``); the others take ``--fp8-format``. A row says which precision won
(``precision``) and, when a layout within ``near_tie_pct`` percent of its best leaves much more memory free,
names it (``near_tie``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
import dataclasses
import hashlib
import json

import optuna

from echo_tune.config.load.hf_config import hf_notes
from echo_tune.config.load.loading import load_cluster
from echo_tune.errors import ConfigError, EchoTuneError
from echo_tune.cost.profile import profile_for
from echo_tune.plan.bands import band_or_none, code_version, kind_of
from echo_tune.plan.anchors import anchor
from echo_tune.plan.host_share import record_host_share
from echo_tune.plan.candidates import (PRECISION_WORDS, PlanCandidate, bad_row, parse_candidate,  # noqa: F401
                                       parse_candidates)  # re-exported
from echo_tune.plan.projection import (SORT_KEYS, GOODPUT_DEFAULT, budget_status, check_goodput,  # noqa: F401
                                      project, sort_rows)
from echo_tune.search.space.labels import full_label
from echo_tune.search.space.auto_space import auto_space_dict, fp8_layout_value, load_model_at
from echo_tune.plan.safety import fit_hint, just_over, near_tie
from echo_tune.search.space.dominance import closest_miss
from echo_tune.search.outputs.results import megatron_flags, trial_record, untimed_record
from echo_tune.search.space.search_space import SearchSpace, space_from_dict, space_profile, with_overrides
from echo_tune.search.storage.study_storage import open_storage
from echo_tune.search.study import SearchOptions, clock_notes, run_search

GIB = 2**30


def precision_of(cfg: dict) -> str:
    """The precision a layout trains in: ``bf16`` or ``fp8 hybrid`` / ``fp8 e4m3``."""
    return f"fp8 {cfg['fp8_format']}" if cfg.get("fp8_format") else "bf16"


@dataclass
class PlanOptions:
    tokens: float
    """Token budget to train."""
    global_batch_size: int | None = None
    """Sequences per step; None: about 4M tokens (2**22 / seq_length), Llama 3's starting batch."""
    currency: str = "USD"
    deadline_days: float | None = None
    budget: float | None = None
    n_trials: int | None = None
    """Trials per candidate; None: the sampler's default, as in ``echo-tune search``."""
    seed: int = 0
    sampler: str = "auto"
    results_dir: str | Path = "results"
    sort: str = "time"
    memory_headroom_gib: float | None = None
    goodput: float = GOODPUT_DEFAULT
    """Share of wall time spent training (plan/projection.py: Llama 3 paper's >90% effective training time)."""
    seq_length: int | None = None
    """Training sequence length; None: the model's (a config.json's pre-training length)."""
    gpu_clock_mhz: float | None = None
    """Every candidate's sustained GPU clock (--gpu-clock-mhz); None: each cluster's own."""
    fp8_format: str = "none"
    """``--fp8-format`` of the candidates that name no precision (FP8_CHOICES of search/space/auto_space.py)."""
    layout: dict | None = None
    """Space-file ``layout:`` entries replacing the built ones on every candidate (``--layout``)."""
    near_tie_pct: float = 3.0
    """A layout this many percent slower than the winner at most, with much more memory free, is named."""


@dataclass
class PlanResult:
    model: str
    tokens: float
    global_batch_size: int
    currency: str
    rows: list[dict]
    spaces: dict[str, SearchSpace] = field(default_factory=dict, repr=False)
    records: dict[str, list[dict]] = field(default_factory=dict, repr=False)
    """Candidate name -> every simulated record of its study (for the explanation)."""
    notes: list[str] = field(default_factory=list)
    """What was assumed reading the model (a config.json's training length, dispatcher, ...)."""
    near_tie_pct: float = 3.0
    seq_length: int | None = None
    """Tokens per sequence of the model planned (printed in the header)."""

    @property
    def winner(self) -> dict | None:
        ok = [r for r in self.rows if r["feasible"] and r["meets_deadline"] is not False
              and r["within_budget"] is not False]
        known = [r for r in ok if not r.get("budget_unknown")]  # with --budget, a candidate without a price
        ok = known or ok  # cannot be shown to fit it: recommended only where no priced one does
        ok = [r for r in ok if not r.get("fallback_at_risk")] or ok  # no layout the search kept: after those that
        ok = [r for r in ok if not r.get("over_limit_at_risk")] or ok  # have one; predicted over its limit: last
        return ok[0] if ok else next((r for r in self.rows if r["feasible"]), None)


def _fingerprint(spec, cluster: str, headroom_gib: float | None, layout: dict | None = None) -> str:
    """8 hex digits of everything a reused study must share besides its name's parts: the model's fields, the
    cluster's, the memory headroom (an edited config.json or cluster file starts a new study) and echo-tune's
    own sources (a study simulated by another version is not mixed into this one's table)."""
    cl = dataclasses.asdict(load_cluster(cluster))
    extra = [layout] if layout else []  # a study without --layout keeps its name
    text = json.dumps([dataclasses.asdict(spec), cl, headroom_gib, code_version()["sources_sha256"]] + extra,
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def default_global_batch_size(seq_length: int) -> int:
    """About 4M tokens (Llama 3's starting batch), as the power of two of sequences nearest to it (in log
    scale), so it divides by every power-of-two data-parallel size times micro-batch: 1024 at 4096 tokens,
    128 (not 102) at Qwen3's 40960."""
    return 2 ** max(0, round(math.log2(2**22 / seq_length)))


def study_records(space: SearchSpace, storage, study_name: str, read=trial_record) -> list[dict]:
    """What ``read`` (``results.trial_record`` or ``untimed_record``) gives of each trial of the stored study."""
    study = optuna.load_study(study_name=study_name, storage=storage)
    return [r for r in (read(t) for t in study.get_trials(deepcopy=False)) if r is not None]


def untimed_records(space: SearchSpace, result) -> list[dict]:
    """The memory records of the layouts the search stored over memory without timing them (``results.untimed_record``),
    as the search left them or read back."""
    if result.untimed is not None:
        return result.untimed
    store = open_storage(Path(result.results_dir), result.storage)
    return study_records(space, store.storage, result.study_name, untimed_record)


def _search(space: SearchSpace, opts: PlanOptions, progress) -> tuple[object, list[dict]]:
    search_opts = SearchOptions(sampler=opts.sampler, n_trials=opts.n_trials, seed=opts.seed,
                                results_dir=opts.results_dir, resume=True)
    result = run_search(space, search_opts, progress=progress)
    if result.records is not None:
        return result, result.records
    store = open_storage(Path(opts.results_dir) / space.name, None)
    return result, study_records(space, store.storage, space.name)


def _row(c: PlanCandidate, space: SearchSpace, result, records: list[dict], opts: PlanOptions) -> dict:
    model = space.model
    row = {"candidate": c.name, "cluster": space.cluster.name, "gpu": space.cluster.gpu.name, "num_gpus": c.num_gpus,
           "gpu_hour_price": c.gpu_hour_price, "currency": opts.currency if c.gpu_hour_price else None,
           "study": str(Path(result.results_dir)), "n_trials": result.n_trials, "n_feasible": result.n_feasible,
           "space_size": result.space_size, "coverage": result.coverage, "n_dominated": result.n_dominated,
           "n_dominated_memory": result.n_dominated_memory}
    best = result.best["config"] if result.best else {}
    fp8 = "fp4" if best.get("fp4_format") else bool(best.get("fp8_format"))
    share = (lambda: record_host_share(space, result.best)) if result.best else None
    row["error_band"] = band_or_none(profile_for(space.cluster), space.cluster, kind_of(model), fp8, c.num_gpus,
                                     host_share=share)
    row["precision_searched"] = "bf16+fp8" if len(space.choices.get("fp8_format", (None,))) > 1 else \
        precision_of({"fp8_format": space.choices.get("fp8_format", (None,))[0]})
    best = result.best or just_over(space, records)  # none fits: one just over its limit is at risk
    if best is None:
        miss = closest_miss(space, [r for r in records if not r["fits_memory"]] + untimed_records(space, result))
        row.update(feasible=False, layout=None, step_time_s=None, tokens_per_s=None, mfu=None, days=None,
                   gpu_hours=None, cost=None, headroom_gib=None, meets_deadline=None, within_budget=None,
                   precision=None, near_tie=None,
                   closest_miss=None if miss is None else {
                       "layout": full_label(miss["config"], miss["derived"].get("data_parallel_size")),
                       "over_gib": miss["memory_overshoot_bytes"] / GIB, "config": miss["config"]},
                   fit_hint=None if miss is None else fit_hint(space, miss))
        return row
    seconds = opts.tokens / best["tokens_per_s"]
    # the band's median and range applied to days, GPU-hours and cost, over the goodput (plan/projection.py)
    proj = project(seconds, row["error_band"], num_gpus=c.num_gpus, gpu_hour_price=c.gpu_hour_price,
                   deadline_days=opts.deadline_days, goodput=opts.goodput)
    days, gpu_hours, cost = proj["days"], proj["gpu_hours"], proj["cost"]
    # the best entry is simulate's report (StepReport.to_dict): its memory band, fits / at risk
    row.update(feasible=True, memory_band=best["memory_band"], memory_verdict=best["memory_verdict"], layout=full_label(best["config"], best["derived"].get("data_parallel_size")),
               config=best["config"], data_parallel_size=best["derived"].get("data_parallel_size"),
               step_time_s=best["step_time_s"], tokens_per_s=best["tokens_per_s"],
               mfu=best["mfu"], peak_memory_gib=best["peak_memory_bytes"] / GIB,
               headroom_gib=(space.cluster.gpu.memory_bytes - best["peak_memory_bytes"]) / GIB,
               days=days, days_band=proj["days_band"], gpu_hours=gpu_hours, gpu_hours_band=proj["gpu_hours_band"],
               cost=cost, cost_band=proj["cost_band"], goodput=proj["goodput"], deadline=proj["deadline"],
               predicted_days=seconds / 86400.0,
               breakdown_s=best["breakdown_s"], megatron_args=best["megatron_args"],
               # one rule for both: the expected days / cost (the band's median applied) against the limit; the
               # band crossing it is "at risk" (deadline / budget), said in the notes
               meets_deadline=None if opts.deadline_days is None else days <= opts.deadline_days,
               within_budget=None if opts.budget is None or cost is None else cost <= opts.budget,
               budget_unknown=opts.budget is not None and cost is None,
               budget=budget_status(cost, proj["cost_band"], opts.budget),
               closest_miss=None, fit_hint=None, precision=precision_of(best["config"]),
               over_limit_at_risk=bool(best.get("over_limit_at_risk")),
               fallback_at_risk=bool(best.get("fallback_at_risk")),
               near_tie=near_tie(records, opts.near_tie_pct, space))
    if row["near_tie"] is not None:
        row["near_tie"]["megatron_args"] = " ".join(megatron_flags(space, {"config": row["near_tie"]["config"]}))
    row["measured_anchor"] = anchor(model, space.cluster.gpu.name, c.num_gpus, space.global_batch_size,
                                    best["step_time_s"])
    return row


def _reasons(rows: list[dict]) -> str:
    return "; ".join(f"{r['candidate']}: {r['error']}" for r in rows)


def _space(c: PlanCandidate, model: str, spec, gbs: int, opts: PlanOptions, cluster, stem: str):
    """The candidate's search space and its ``--fp8-format`` (raises the candidate's one-line error)."""
    fp8 = c.fp8_format or opts.fp8_format
    fp8_value = fp8_layout_value(fp8, cluster, c.cluster)
    # no price in the study: the plan prices its rows itself (projection.project), so a rerun at another
    # price reuses the study (a study stores each trial's cost per step at its price: a new price refused it)
    data = auto_space_dict(model, c.cluster, c.num_gpus, gbs, gpu_hour_cost=None,
                           seq_length=opts.seq_length, fp8_format=fp8, layout=opts.layout,
                           name=f"plan-{stem}-{c.num_gpus}x{Path(c.cluster).stem}-gbs{gbs}-"
                                + (f"fp8{fp8_value}-" if fp8_value else "")
                                + f"{_fingerprint(spec, c.cluster, opts.memory_headroom_gib, opts.layout)}")
    if opts.memory_headroom_gib is not None:
        data["memory_headroom_gib"] = opts.memory_headroom_gib
    space = space_from_dict(data, name=data["name"], source=data["name"])
    if opts.gpu_clock_mhz is not None:
        space = with_overrides(space, gpu_clock_mhz=opts.gpu_clock_mhz)
    return space, fp8


def plan(model: str, candidates: list[PlanCandidate], opts: PlanOptions, *,
         progress: Callable[[str, int, int | None, dict | None], None] | None = None,
         rejected: list[dict] = ()) -> PlanResult:
    """Check every candidate, then search the good ones (reusing finished studies) and build the planner's rows;
    a candidate that cannot be planned is a row with its reason (``bad_row``), as are ``rejected`` ones (the
    candidates whose text could not be read: ``candidates.parse_candidates``)."""
    if not candidates and rejected:
        raise ConfigError(f"no candidate can be planned: {_reasons(rejected)}")
    if not candidates:
        raise ConfigError("plan needs at least one candidate: --candidate CLUSTER:GPUS[:PRICE]")
    if not opts.tokens > 0:
        raise ConfigError(f"`--tokens > 0` must hold, but got ({opts.tokens})")
    for name, value in (("--deadline-days", opts.deadline_days), ("--budget", opts.budget)):
        if value is not None and value <= 0:
            raise ConfigError(f"`{name} > 0` must hold, but got ({value})")
    check_goodput(opts.goodput)
    spec = load_model_at(model, opts.seq_length)
    gbs = opts.global_batch_size or default_global_batch_size(spec.seq_length)
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ConfigError(f"candidates must differ, but {sorted({n for n in names if names.count(n) > 1})} repeat")
    clusters = {c.cluster: load_cluster(c.cluster) for c in candidates}
    seen: dict[tuple, str] = {}  # one cluster by two names (h100, h100-sxm) is one candidate too
    for c in candidates:
        key = (clusters[c.cluster].name, c.num_gpus, c.fp8_format, c.precision_word)
        if key in seen:
            raise ConfigError(f"candidates must differ, but ({seen[key]!r}, {c.name!r}) are the same cluster "
                              f"({key[0]}) with the same GPUs; keep one of them")
        seen[key] = c.name
    stem = spec.name.replace("/", "_")

    # every candidate is checked (its space built) before any is searched: a bad one is a row with its reason
    checked, bad = [], [dict(r) for r in rejected]
    for c in candidates:
        try:
            checked.append((c, *_space(c, model, spec, gbs, opts, clusters[c.cluster], stem)))
        except EchoTuneError as exc:
            bad.append(bad_row(c.name, exc, c, clusters[c.cluster]))
    if not checked:
        raise ConfigError(f"no candidate can be planned: {_reasons(bad)}")
    rows, spaces, records, bf16_only, clocks = [], {}, {}, [], []
    for c, space, fp8 in checked:
        bar = None if progress is None else (lambda done, total, rec, _n=c.name: progress(_n, done, total, rec))
        try:
            result, recs = _search(space, opts, bar)
        except EchoTuneError as exc:  # what only the search finds: the other candidates are still planned
            bad.append(bad_row(c.name, exc, c, space.cluster))
            continue
        if result.interrupted:  # Ctrl-C or SIGTERM: the finished trials are stored; a rerun resumes them
            raise KeyboardInterrupt
        rows.append(_row(c, space, result, recs, opts))
        clocks += [n for n in clock_notes(space, space_profile(space)) if n not in clocks]
        if fp8 == "none" and c.fp8_format is None and space.cluster.gpu.peak_fp8_tflops is not None:
            bf16_only.append(c.name)
        spaces[c.name], records[c.name] = space, recs
    if not rows:
        raise ConfigError(f"no candidate can be planned: {_reasons(bad)}")
    notes = list(clocks)
    if str(model).endswith(".json"):
        notes = [f"{model}: {n}" for n in hf_notes(model, seq_length=opts.seq_length)]
    if bf16_only:
        notes.append(f"{', '.join(bf16_only)}: searched in BF16 only, though the GPU has FP8 tensor cores; add "
                     f":fp8 to the candidate (or --fp8-format auto) to search FP8 too")
    if opts.global_batch_size is None:
        notes.append(f"global batch {gbs} sequences = {gbs * spec.seq_length:,} tokens (the power of two nearest "
                     f"4M tokens, Llama 3's starting batch, so that it divides by power-of-two DP x micro-batch "
                     f"sizes); set --global-batch-size for another")
    if bad:
        names = ", ".join(r["candidate"] for r in bad)
        notes.append(f"{len(bad)} of {len(bad) + len(rows)} candidates could not be planned ({names}: each listed "
                     f"with its reason); the others were planned, and the exit code is 0 when one of them fits (1 "
                     f"when none fits, 2 when no candidate can be planned)")
    return PlanResult(model=spec.name, tokens=opts.tokens, global_batch_size=gbs, seq_length=spec.seq_length,
                      currency=opts.currency, rows=sort_rows(rows, opts.sort) + bad, spaces=spaces, records=records,
                      notes=notes, near_tie_pct=opts.near_tie_pct)
