"""``plan``: search each candidate cluster for its best layout, then price the token budget on each.

A candidate is a cluster (preset or file), a GPU count and optionally the price of one GPU-hour. Each is
searched with the zero-YAML space (``search/auto_space.py``) in its own study under
``RESULTS_DIR/plan-<model>-<gpus>x<cluster>-gbs<G>/``; a finished study is reused (resumed: only missing
trials run). The row of a candidate holds its best layout's step time, tokens/s, MFU, memory headroom, days,
GPU-hours, cost and the error band of its validated family; a candidate whose every layout overflows memory
is shown as infeasible with the closest miss and no time or cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from echo_tune.config.loading import load_cluster
from echo_tune.errors import ConfigError
from echo_tune.plan.bands import band_for, band_summary
from echo_tune.plan.labels import full_label
from echo_tune.search.auto_space import auto_space_dict, load_model_at
from echo_tune.search.results import trial_record
from echo_tune.search.space import SearchSpace, space_from_dict

SORT_KEYS = ("time", "cost")
GIB = 2**30


@dataclass(frozen=True)
class PlanCandidate:
    cluster: str
    num_gpus: int
    gpu_hour_price: float | None = None

    @property
    def name(self) -> str:
        return f"{self.num_gpus} x {self.cluster}"


def parse_candidate(text: str) -> PlanCandidate:
    """``CLUSTER:GPUS[:PRICE]``, e.g. ``h100:256:2.49`` (price of one GPU-hour, in the plan's currency)."""
    parts = str(text).split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise ConfigError(f"a candidate must be CLUSTER:GPUS[:PRICE] such as h100:256:2.49, but got ({text!r})")
    try:
        gpus = int(parts[1])
        price = float(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ConfigError(f"a candidate must be CLUSTER:GPUS[:PRICE] with an integer GPU count and a number as "
                          f"price, but got ({text!r})") from None
    if gpus <= 0 or (price is not None and price <= 0):
        raise ConfigError(f"`GPUS > 0` and `PRICE > 0` must hold in a candidate, but got ({text!r})")
    load_cluster(parts[0])  # a bad cluster fails here with its one-line error
    return PlanCandidate(cluster=parts[0], num_gpus=gpus, gpu_hour_price=price)


@dataclass
class PlanOptions:
    tokens: float
    """Token budget to train."""
    global_batch_size: int | None = None
    """Sequences per step; None: about 4M tokens (2**22 / seq_length), Llama 3's starting batch."""
    currency: str = "USD"
    deadline_days: float | None = None
    budget: float | None = None
    n_trials: int = 120
    seed: int = 0
    sampler: str = "tpe"
    results_dir: str | Path = "results"
    sort: str = "time"
    memory_headroom_gib: float | None = None
    seq_length: int | None = None
    """Training sequence length; None: the model's (a config.json's pre-training length)."""


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

    @property
    def winner(self) -> dict | None:
        ok = [r for r in self.rows if r["feasible"] and r["meets_deadline"] is not False
              and r["within_budget"] is not False]
        return ok[0] if ok else next((r for r in self.rows if r["feasible"]), None)


def _fingerprint(spec, cluster: str, headroom_gib: float | None) -> str:
    """8 hex digits of everything a reused study must share besides its name's parts: the model's fields, the
    cluster's and the memory headroom (an edited config.json or cluster file starts a new study)."""
    import dataclasses
    import hashlib
    import json

    cl = dataclasses.asdict(load_cluster(cluster))
    text = json.dumps([dataclasses.asdict(spec), cl, headroom_gib], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def default_global_batch_size(seq_length: int) -> int:
    return max(1, 2**22 // seq_length)


def study_records(space: SearchSpace, storage, study_name: str) -> list[dict]:
    study = optuna.load_study(study_name=study_name, storage=storage)
    return [r for r in (trial_record(t) for t in study.get_trials(deepcopy=False)) if r is not None]


def _search(space: SearchSpace, opts: PlanOptions, progress) -> tuple[object, list[dict]]:
    from echo_tune.search.storage import open_storage
    from echo_tune.search.study import SearchOptions, run_search

    search_opts = SearchOptions(sampler=opts.sampler, n_trials=opts.n_trials, seed=opts.seed,
                                results_dir=opts.results_dir, resume=True)
    result = run_search(space, search_opts, progress=progress)
    store = open_storage(Path(opts.results_dir) / space.name, None)
    return result, study_records(space, store.storage, space.name)


def _row(c: PlanCandidate, space: SearchSpace, result, records: list[dict], opts: PlanOptions) -> dict:
    model = space.model
    row = {"candidate": c.name, "cluster": space.cluster.name, "gpu": space.cluster.gpu.name, "num_gpus": c.num_gpus,
           "gpu_hour_price": c.gpu_hour_price, "currency": opts.currency if c.gpu_hour_price else None,
           "study": str(Path(result.results_dir)), "n_trials": result.n_trials, "n_feasible": result.n_feasible}
    band = band_for(space.cluster.gpu.name, model.is_moe, False, c.num_gpus)
    row["error_band"] = band_summary(band)
    best = result.best
    if best is None:
        over = [r for r in records if not r["fits_memory"]]
        miss = min(over, key=lambda r: r["memory_overshoot_bytes"]) if over else None
        row.update(feasible=False, layout=None, step_time_s=None, tokens_per_s=None, mfu=None, days=None,
                   gpu_hours=None, cost=None, headroom_gib=None, meets_deadline=None, within_budget=None,
                   closest_miss=None if miss is None else {
                       "layout": full_label(miss["config"], miss["derived"].get("data_parallel_size")),
                       "over_gib": miss["memory_overshoot_bytes"] / GIB, "config": miss["config"]})
        return row
    seconds = opts.tokens / best["tokens_per_s"]
    gpu_hours = seconds * c.num_gpus / 3600.0
    cost = gpu_hours * c.gpu_hour_price if c.gpu_hour_price is not None else None
    days = seconds / 86400.0
    ratio_lo, ratio_hi = row["error_band"]["measured_over_predicted"]
    row.update(feasible=True, layout=full_label(best["config"], best["derived"].get("data_parallel_size")),
               config=best["config"], data_parallel_size=best["derived"].get("data_parallel_size"),
               step_time_s=best["step_time_s"], tokens_per_s=best["tokens_per_s"],
               mfu=best["mfu"], peak_memory_gib=best["peak_memory_bytes"] / GIB,
               headroom_gib=(space.cluster.gpu.memory_bytes - best["peak_memory_bytes"]) / GIB,
               days=days, days_band=(days * ratio_lo, days * ratio_hi), gpu_hours=gpu_hours, cost=cost,
               breakdown_s=best["breakdown_s"], megatron_args=best["megatron_args"],
               meets_deadline=None if opts.deadline_days is None else days <= opts.deadline_days,
               within_budget=None if opts.budget is None or cost is None else cost <= opts.budget,
               closest_miss=None)
    return row


def sort_rows(rows: list[dict], by: str) -> list[dict]:
    if by not in SORT_KEYS:
        raise ConfigError(f"`--sort` must be one of {list(SORT_KEYS)}, but got ({by!r})")
    inf = float("inf")
    key = (lambda r: (r["days"], r["cost"] if r["cost"] is not None else inf)) if by == "time" else \
        (lambda r: (r["cost"] if r["cost"] is not None else inf, r["days"]))
    feasible = sorted((r for r in rows if r["feasible"]), key=key)
    return feasible + [r for r in rows if not r["feasible"]]


def plan(model: str, candidates: list[PlanCandidate], opts: PlanOptions, *,
         progress: Callable[[str, int, int | None, dict | None], None] | None = None) -> PlanResult:
    """Search every candidate (reusing finished studies) and build the planner's rows."""
    if not candidates:
        raise ConfigError("plan needs at least one candidate: --candidate CLUSTER:GPUS[:PRICE]")
    if not opts.tokens > 0:
        raise ConfigError(f"`--tokens > 0` must hold, but got ({opts.tokens})")
    for name, value in (("--deadline-days", opts.deadline_days), ("--budget", opts.budget)):
        if value is not None and value <= 0:
            raise ConfigError(f"`{name} > 0` must hold, but got ({value})")
    spec = load_model_at(model, opts.seq_length)
    gbs = opts.global_batch_size or default_global_batch_size(spec.seq_length)
    names = [c.name for c in candidates]
    if len(set(names)) != len(names):
        raise ConfigError(f"candidates must differ, but {sorted({n for n in names if names.count(n) > 1})} repeat")
    stem = spec.name.replace("/", "_")
    rows, spaces, records = [], {}, {}
    for c in candidates:
        data = auto_space_dict(model, c.cluster, c.num_gpus, gbs, gpu_hour_cost=c.gpu_hour_price,
                               seq_length=opts.seq_length,
                               name=f"plan-{stem}-{c.num_gpus}x{Path(c.cluster).stem}-gbs{gbs}-"
                                    f"{_fingerprint(spec, c.cluster, opts.memory_headroom_gib)}")
        if opts.memory_headroom_gib is not None:
            data["memory_headroom_gib"] = opts.memory_headroom_gib
        space = space_from_dict(data, name=data["name"], source=data["name"])
        bar = None if progress is None else (lambda done, total, rec, _n=c.name: progress(_n, done, total, rec))
        result, recs = _search(space, opts, bar)
        if result.interrupted:  # Ctrl-C or SIGTERM: the finished trials are stored; a rerun resumes them
            raise KeyboardInterrupt
        rows.append(_row(c, space, result, recs, opts))
        spaces[c.name], records[c.name] = space, recs
    notes = []
    if str(model).endswith(".json"):
        from echo_tune.config.hf_config import hf_notes

        notes = [f"{model}: {n}" for n in hf_notes(model, seq_length=opts.seq_length)]
    if opts.global_batch_size is None:
        notes.append(f"global batch {gbs} sequences = {gbs * spec.seq_length:,} tokens (about 4M, Llama 3's "
                     f"starting batch); set --global-batch-size for another")
    return PlanResult(model=spec.name, tokens=opts.tokens, global_batch_size=gbs, currency=opts.currency,
                      rows=sort_rows(rows, opts.sort), spaces=spaces, records=records, notes=notes)
