"""Rank candidate runs before booking GPUs: which option trains the model fastest and cheapest?

A rank file lists candidates; each is a model, a cluster, a GPU count and a full layout, or a pointer to
a search result (its ``best.json`` or results folder)::

    tokens: 1e12                    # token budget for "time and cost to train" (--tokens overrides)
    defaults:                       # optional keys every candidate starts from (layouts merge)
      model: gpt3-175b
    candidates:
      - name: 64 x H800, TP8 PP8
        cluster: h800-sxm
        num_gpus: 64
        gpu_hour_cost: 2.0          # optional, price of one GPU-hour
        layout: {tensor_model_parallel_size: 8, pipeline_model_parallel_size: 8, global_batch_size: 1536,
                 micro_batch_size: 1, recompute_granularity: selective, sequence_parallel: true}
      - name: 128 x A100 from a Megatron launch line   # its model flags override `model`
        cluster: a100-80gb
        num_gpus: 128
        megatron_args: "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 16 --global-batch-size 1536"
      - name: searched layout
        from_search: results/gpt3-175b-96xh800      # or .../best.json

Candidates print fastest first; the ones that do not fit in memory come after all that fit, and a
candidate with a setting that shapes the step but is not modelled is listed last as refused (no number).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.load.loading import build, check_keys, cluster_from_dict, read_yaml
from echo_tune.config.launch.line_flags import drop_unused_recompute
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.cost.profile import load_profile, profile_for
from echo_tune.errors import ConfigError
from echo_tune.io import read_text
from echo_tune.limits import check_number
from echo_tune.plan.bands import band_or_none, kind_of, precision_of
from echo_tune.plan.anchors import anchor
from echo_tune.plan.host_share import host_share_once
from echo_tune.plan.projection import GOODPUT_DEFAULT, check_goodput, project, sort_rows
from echo_tune.safe_yaml import load_json
from echo_tune.search.space.fields import MODEL_LAYOUT_FIELDS
from echo_tune.search.space.space_values import load_cluster_ref, load_model_ref, resolve_ref
from echo_tune.sim.simulate import simulate
from echo_tune.sim.step_setup import clock_note_for

FILE_KEYS = ("tokens", "defaults", "candidates", "description")
CANDIDATE_KEYS = ("name", "model", "cluster", "num_gpus", "layout", "megatron_args", "from_search", "gpu_hour_cost",
                  "precision", "profile", "notes")


@dataclass(frozen=True)
class RankCandidate:
    name: str
    model: ModelSpec
    cluster: ClusterSpec
    num_gpus: int
    parallel: ParallelConfig
    gpu_hour_cost: float | None = None
    profile_path: Path | None = None
    refused: str | None = None
    """Why the candidate is refused (a setting that shapes the step but is not modelled); then the specs
    may be None and ``rank`` lists it as refused, never with a number."""


def _from_search(ref: str, where: str, base_dir: Path | None) -> dict:
    path = Path(resolve_ref(ref if ref.endswith(".json") else ref.rstrip("/") + "/best.json", base_dir))
    if not path.is_file():
        raise ConfigError(f"{where}: `from_search` must point to a search result (a results folder or its "
                          f"best.json), but {str(path)!r} does not exist; run echo-tune search first")
    try:
        best = load_json(read_text(path, "best.json"), f"{where}: {str(path)!r}")
        config, specs = dict(best["config"]), dict(best["specs"])
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{where}: {str(path)!r} is not a best.json written by echo-tune search") from None
    missing = [k for k, d in (("config.num_gpus", config), ("specs.model_spec", specs),
                              ("specs.cluster_spec", specs)) if k.split(".")[1] not in d]
    bad = [k for k in ("model_spec", "cluster_spec") if k in specs and not isinstance(specs[k], dict)]
    if missing or bad:
        raise ConfigError(f"{where}: {str(path)!r} lacks {missing + bad} (or holds no mapping there), which a "
                          f"best.json written by echo-tune search has; rerun the search or give a `layout`")
    # the model settings the search chose for the layout (dispatcher, fusions: search/space/fields.py) are the model's
    chosen = {f: config.pop(f) for f in MODEL_LAYOUT_FIELDS if f in config}
    model = build(ModelSpec, {**specs["model_spec"], **chosen}, f"{where}: model of {path}")
    cluster = cluster_from_dict(dict(specs["cluster_spec"]), name=str(specs["cluster_spec"].get("name", "cluster")))
    num_gpus = config.pop("num_gpus")
    return {"model": model, "cluster": cluster, "num_gpus": num_gpus, "layout": config}


def _candidate(data: dict, index: int, defaults: dict, base_dir: Path | None) -> RankCandidate:
    if not isinstance(data, dict):
        raise ConfigError(f"candidate #{index + 1} must be a mapping of keys, but got {type(data).__name__}")
    merged = {**defaults, **data}
    if isinstance(defaults.get("layout"), dict) and isinstance(data.get("layout"), dict):
        merged["layout"] = {**defaults["layout"], **data["layout"]}  # a candidate's settings override
    elif "layout" in data and data["layout"] is None:  # `layout: null`: none, not even the defaults'
        merged.pop("layout")
    name = str(merged.get("name") or f"candidate {index + 1}")
    where = f"candidate {name!r}"
    check_keys(merged, CANDIDATE_KEYS, where)
    if not any(k in merged for k in ("layout", "megatron_args", "from_search")):
        raise ConfigError(f"{where}: give a `layout`, `megatron_args` or `from_search`")
    layout: dict = {}
    if "from_search" in merged:  # the searched layout; the candidate's own layout keys override it
        found = _from_search(str(merged["from_search"]), where, base_dir)
        merged = {**found, **{k: v for k, v in merged.items() if k not in ("from_search", "layout")},
                  "layout": {**found["layout"], **(data.get("layout") or {})}}
    line_model: dict = {}
    if "megatron_args" in merged:
        base = None
        if "model" in merged:  # the line is laid over the candidate's model (its own flags count as given)
            base = merged["model"] if isinstance(merged["model"], ModelSpec) else load_model_ref(
                merged["model"], where, base_dir)
        line_model, fields, precision, _ = parse_megatron_line(str(merged["megatron_args"]), base=base,
                                                               megatron_lm=True)
        layout.update(fields)
        if precision is not None:
            layout["precision"] = precision
    if isinstance(merged.get("layout"), dict):
        layout.update(merged["layout"])
    elif "layout" in merged:
        raise ConfigError(f"{where}: `layout` must be a mapping of Megatron settings, but got {merged['layout']!r}")
    if "megatron_args" in merged:  # the line's recompute count without any granularity: Megatron ignores it
        drop_unused_recompute(layout)
    if "model" not in merged and line_model:  # the launch line describes the model
        merged["model"] = build(ModelSpec, {"name": name, **line_model}, f"{where}: model of megatron_args")
        line_model = {}
    for key in ("model", "cluster", "num_gpus"):
        if key not in merged:
            raise ConfigError(f"{where}: missing required key {key!r}")
    if "precision" in merged:
        layout["precision"] = merged["precision"]
    model = merged["model"] if isinstance(merged["model"], ModelSpec) else load_model_ref(merged["model"], where,
                                                                                         base_dir)
    if line_model:  # model flags of the launch line override the candidate's model
        model = model.replace(**line_model)
    cluster = merged["cluster"] if isinstance(merged["cluster"], ClusterSpec) else load_cluster_ref(
        merged["cluster"], where, base_dir)
    num_gpus = merged["num_gpus"]
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus <= 0:
        raise ConfigError(f"{where}: `num_gpus > 0` must hold for an integer, but got (num_gpus={num_gpus!r})")
    try:
        check_number("num_gpus", num_gpus)  # the CLI's cap (2^20), for files as for flags
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if "global_batch_size" not in layout:
        raise ConfigError(f"{where}: the layout needs `global_batch_size` (--global-batch-size)")
    parallel = build(ParallelConfig, layout, f"{where} layout")
    cost = merged.get("gpu_hour_cost")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost > 0):
        raise ConfigError(f"{where}: `gpu_hour_cost > 0` must hold, but got (gpu_hour_cost={cost!r})")
    if cost is not None:
        try:
            check_number("gpu_hour_cost", cost)  # NaN, inf and absurd prices (echo_tune.limits)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if merged.get("profile") is not None and not isinstance(merged["profile"], str):
        raise ConfigError(f"{where}: `profile` must be the path of a profile YAML file, but got "
                          f"(profile={merged['profile']!r})")
    profile = Path(resolve_ref(merged["profile"], base_dir)) if merged.get("profile") else None
    return RankCandidate(name=name, model=model, cluster=cluster, num_gpus=num_gpus, parallel=parallel,
                         gpu_hour_cost=float(cost) if cost is not None else None, profile_path=profile)


def _candidate_or_refused(data, index: int, defaults: dict, base_dir: Path | None) -> RankCandidate:
    try:
        return _candidate(data, index, defaults, base_dir)
    except UnmodelledError as exc:
        name = str((data if isinstance(data, dict) else {}).get("name") or f"candidate {index + 1}")
        return RankCandidate(name=name, model=None, cluster=None, num_gpus=0, parallel=None, refused=str(exc))


def parse_tokens(value) -> float:
    try:
        tokens = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"`tokens` must be a number of tokens such as 1e12, but got ({value!r})") from None
    if not tokens > 0:
        raise ConfigError(f"`tokens > 0` must hold, but got (tokens={value!r})")
    check_number("tokens", tokens)  # inf, or more tokens than any run: echo_tune.limits
    return tokens


def load_rank_file(path: str | Path) -> tuple[list[RankCandidate], float | None]:
    """The candidates of a rank file and its token budget (None if it sets none)."""
    path = Path(path)
    data = read_yaml(path, "rank")
    check_keys(data, FILE_KEYS, f"rank file {str(path)!r}")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"rank file {str(path)!r}: `defaults` must be a mapping, but got {defaults!r}")
    candidates = data.get("candidates")
    if not isinstance(candidates, list) or not candidates:
        raise ConfigError(f"rank file {str(path)!r} must list at least one entry under `candidates`")
    parsed = [_candidate_or_refused(c, i, defaults, path.parent) for i, c in enumerate(candidates)]
    names = [c.name for c in parsed]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"rank file {str(path)!r}: candidate names must be unique, but {dupes} repeat")
    tokens = parse_tokens(data["tokens"]) if data.get("tokens") is not None else None
    return parsed, tokens


def _clock_note(c: RankCandidate, profile, report) -> str | None:
    """The candidate's clock note (its GPU at its peak's clock for want of a sustained one, or at a derived one),
    as its report says it (``clock_note``; None where a measured or given clock is in use)."""
    note = clock_note_for(c.cluster, profile)
    return note if note in report.notes else None


def rank(candidates: list[RankCandidate], tokens: float, memory_headroom_gib: float = 2.0, *,
         sort: str = "time", goodput: float = GOODPUT_DEFAULT, deadline_days: float | None = None) -> list[dict]:
    """Simulate every candidate; fitting ones first (fastest, or cheapest with ``sort="cost"``), then the ones
    that do not fit, with no time or cost (a candidate fits when it leaves ``memory_headroom_gib`` free, as in
    ``search``). Each row carries the planner's columns: headroom, days, GPU-hours, cost, error band; days,
    GPU-hours and cost carry the band's median and range and the goodput (plan/projection.py), while
    ``time_to_train_s`` is the simulator's own tokens / throughput."""
    check_goodput(goodput)
    rows, refused = [], []
    for c in candidates:
        if c.refused:
            refused.append({"name": c.name, "refused": c.refused, "rank": None})
            continue
        profile = load_profile(c.profile_path) if c.profile_path else None
        try:
            report = simulate(c.model, c.cluster, c.num_gpus, c.parallel, profile=profile,
                              memory_headroom_bytes=int(memory_headroom_gib * 2**30))
        except UnmodelledError as exc:
            refused.append({"name": c.name, "refused": str(exc), "rank": None})
            continue
        except ConfigError as exc:
            raise ConfigError(f"candidate {c.name!r}: {exc}") from None
        fits = report.fits_memory
        seconds = tokens / report.tokens_per_s if fits else None  # a layout that does not fit has no time
        share = host_share_once(c.model, c.cluster, c.num_gpus, c.parallel, profile=profile,
                                step_time_s=report.step_time_s, memory_headroom_bytes=int(memory_headroom_gib * 2**30))
        used = profile or profile_for(c.cluster)
        band = band_or_none(used, c.cluster, kind_of(c.model), precision_of(c.parallel), c.num_gpus, host_share=share)
        proj = project(seconds, band, num_gpus=c.num_gpus, gpu_hour_price=c.gpu_hour_cost,
                       deadline_days=deadline_days, goodput=goodput) if fits else {}
        row = {"name": c.name, **report.to_dict(), "tokens": tokens, "time_to_train_s": seconds,
               "time_to_train_days": proj.get("days"), "gpu_hours": proj.get("gpu_hours"),
               "gpu_hour_cost": c.gpu_hour_cost, "cost": proj.get("cost"),
               **{k: proj.get(k) for k in ("days_band", "gpu_hours_band", "cost_band", "goodput", "deadline")},
               "headroom_gib": (c.cluster.gpu.memory_bytes - report.peak_memory_bytes) / 2**30,
               "error_band": band, "clock_note": _clock_note(c, profile, report),
               "host_share": share() if fits and used.host_time_per_kernel_s > 0 else None,
               "measured_anchor": anchor(c.model, c.cluster.gpu.name, c.num_gpus, c.parallel.global_batch_size,
                                         report.step_time_s) if fits else None}
        rows.append(row)
    for r in rows:  # the planner's sort keys: the expected days and cost shown (band median and goodput applied)
        r["feasible"], r["days"] = r["fits_memory"], r["time_to_train_days"]
    rows = sort_rows(rows, sort)

    for i, r in enumerate(rows, 1):
        r["rank"] = i
    return rows + refused
