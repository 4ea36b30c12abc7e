"""Search-space files: parse and check the YAML, expand ``auto`` into every value a rule allows.

A space file names the model, the cluster, the GPU count(s), the global batch size and, under
``layout:``, the values each Megatron-LM setting may take::

    name: gpt3-175b-1024xa100
    model: gpt3-175b              # preset name or YAML file (relative to this file)
    cluster: a100-80gb            # preset name or YAML file
    num_gpus: 1024                # or a list: the GPU count becomes a searched setting
    global_batch_size: 1536
    precision: bf16
    objectives: [step_time]       # or [step_time, peak_memory] / [step_time, num_gpus] / [step_time, cost]
    gpu_hour_cost: 2.0            # optional, price of one GPU-hour (for the cost objective)
    currency: USD                 # optional, the price's currency (default USD; labels the cost axis)
    layout:
      tensor_model_parallel_size: auto       # auto: every value a rule allows (micro-batch and CP capped,
                                             # see AUTO_CAPS)
      pipeline_model_parallel_size: [8, 16]  # a list: these values
      recompute_granularity: [none, selective, full]
      use_distributed_optimizer: true        # one value: fixed
      fp8_format: [none, hybrid]             # bf16 or FP8 linear GEMMs (precision stays bf16)
      decoder_first_pipeline_num_layers: auto  # auto on any of the four split settings (with the
      decoder_last_pipeline_num_layers: auto   # account_for_embedding/loss_in_pipeline_split flags):
                                               # per PP the canonical uneven splits of search/space/uneven.py

Which combinations are valid is decided in ``layouts.py`` by ``check_compatible``, the simulator's
own rules; each value is checked on its own in ``space_values.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.config.specs.cluster import PRECISIONS, ClusterSpec
from echo_tune.config.load.loading import check_keys, read_yaml
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.flags.unmodelled import refuse_unmodelled_keys
from echo_tune.cost.profile import load_profile
from echo_tune.errors import ConfigError
from echo_tune.search.space.auto_values import auto_values
from echo_tune.search.space.fields import FIELD_ORDER, LAYOUT_FIELDS
from echo_tune.search.space.space_values import (check_model_values, checked_number, default_choice, is_auto,
                                                 load_cluster_ref, load_model_ref, normalize_value, positive_int,
                                                 resolve_ref, space_error)
from echo_tune.search.space.uneven import SPLIT_FIELDS

OBJECTIVES = ("step_time", "peak_memory", "num_gpus", "cost")
SPACE_KEYS = ("name", "description", "model", "cluster", "num_gpus", "global_batch_size", "precision",
              "objectives", "gpu_hour_cost", "currency", "profile", "memory_headroom_gib", "layout")
DEFAULT_MEMORY_HEADROOM_GIB = 2.0
"""Kept in step with sim.memory.DEFAULT_MEMORY_HEADROOM_GIB (which explains it); this module avoids torch."""


@dataclass(frozen=True)
class SearchSpace:
    """A parsed search space: fixed specs and, per searched setting, the values it may take."""

    name: str
    model: ModelSpec
    cluster: ClusterSpec
    global_batch_size: int
    precision: str
    objectives: tuple[str, ...]
    choices: dict[str, tuple]
    """FIELD_ORDER field -> allowed values (one value = fixed). Always has every field."""
    gpu_hour_cost: float | None = None
    currency: str = field(default="USD", compare=False)
    """Currency of ``gpu_hour_cost`` (labels the cost objective's columns and axis)."""
    memory_headroom_gib: float = DEFAULT_MEMORY_HEADROOM_GIB
    """A layout fits only if its peak memory stays this far under the GPU's HBM."""
    safe_memory: bool = True
    """A layout that fits by less than the memory model's measured error (memory band "at risk",
    sim/memory/memory_band.py: 7.3% of its peak) counts as not fitting, so a recommended layout is never at risk by the
    tool's own statistic; off when a headroom is given (``--memory-headroom-gib`` or ``memory_headroom_gib``)."""
    profile_path: Path | None = None
    source: str = ""
    description: str = ""
    notes: tuple[str, ...] = field(default=(), compare=False)
    canonical_splits: bool = False
    """``auto`` uneven stages: the split settings (decoder_first/last_pipeline_num_layers,
    account_for_embedding/loss_in_pipeline_split) take per PP the canonical splits of search/space/uneven.py."""
    generated_layouts: bool = False
    """``pipeline_model_parallel_layout: auto``: the balanced layouts of search/space/pipeline_layouts.py, each with the
    PP sizes its chunk count divides."""

    @property
    def searched(self) -> tuple[str, ...]:
        """Fields with more than one allowed value, in drawing order."""
        return tuple(f for f in FIELD_ORDER if len(self.choices[f]) > 1)

    @property
    def product_size(self) -> int:
        n = 1
        for values in self.choices.values():
            n *= len(values)
        return n

    def describe(self) -> dict:
        """JSON-friendly summary (stored with the study)."""
        return {"name": self.name, "model": self.model.name, "cluster": self.cluster.name,
                "global_batch_size": self.global_batch_size, "precision": self.precision,
                "objectives": list(self.objectives), "gpu_hour_cost": self.gpu_hour_cost, "source": self.source,
                "choices": {f: list(v) for f, v in self.choices.items()}}


def space_from_dict(data: dict, *, name: str = "space", base_dir: Path | None = None,
                    source: str = "") -> SearchSpace:
    """Build a SearchSpace from the mapping of a space file; one-line ConfigError for anything wrong."""
    where = f"search space {source or name!r}"
    check_keys(data, SPACE_KEYS, f"{where} top-level")
    missing = [k for k in ("model", "cluster", "num_gpus", "global_batch_size") if k not in data]
    if missing:
        raise space_error(where, f"missing required key(s) {missing}")
    model = load_model_ref(data["model"], where, base_dir)
    cluster = load_cluster_ref(data["cluster"], where, base_dir)
    gbs = positive_int(where, "global_batch_size", data["global_batch_size"])
    precision = data.get("precision", "bf16")
    if precision not in PRECISIONS:
        raise space_error(where, f"`precision` must be one of {list(PRECISIONS)}, but got (precision={precision!r})")
    objectives = data.get("objectives", ["step_time"])
    objectives = [objectives] if isinstance(objectives, str) else objectives
    if not isinstance(objectives, list) or not objectives or any(o not in OBJECTIVES for o in objectives) \
            or len(set(objectives)) != len(objectives):
        raise space_error(where, f"`objectives` must be distinct names from {list(OBJECTIVES)}, but got "
                          f"(objectives={data.get('objectives')!r})")
    cost = data.get("gpu_hour_cost")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost > 0):
        raise space_error(where, f"`gpu_hour_cost > 0` must hold, but got (gpu_hour_cost={cost!r})")
    if cost is not None:
        checked_number(where, "gpu_hour_cost", cost)
    currency = data.get("currency", "USD")
    if not isinstance(currency, str) or not currency.strip():
        raise space_error(where, f"`currency` must be a name such as USD or EUR, but got (currency={currency!r})")
    headroom = data.get("memory_headroom_gib", DEFAULT_MEMORY_HEADROOM_GIB)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not headroom >= 0:
        raise space_error(where, f"`memory_headroom_gib >= 0` must hold, but got (memory_headroom_gib={headroom!r})")
    checked_number(where, "memory_headroom_gib", headroom)
    if "memory_headroom_gib" in data:  # as written (the default is for real GPUs; a toy one may be smaller)
        try:
            cluster.gpu.check_headroom(headroom, "memory_headroom_gib")
        except ConfigError as exc:
            raise space_error(where, str(exc)) from None
    profile_path = None
    if data.get("profile") is not None:
        profile_path = Path(resolve_ref(data["profile"], base_dir))
    layout = data.get("layout") or {}
    if not isinstance(layout, dict):
        raise space_error(where, f"`layout` must be a mapping of Megatron setting -> value(s), but got "
                          f"{type(layout).__name__}")
    refuse_unmodelled_keys(layout, LAYOUT_FIELDS, f"{where} layout")
    check_keys(layout, LAYOUT_FIELDS, f"{where} layout")

    raw = {"num_gpus": data["num_gpus"], **layout}
    uneven = any(is_auto(raw.get(f)) for f in SPLIT_FIELDS)
    choices: dict[str, tuple] = {}
    num_gpus: tuple[int, ...] = ()
    for fname in FIELD_ORDER:  # auto for later fields may read earlier choices (vpp reads pp)
        fwhere = f"{where} {'layout.' if fname != 'num_gpus' else ''}{fname}"
        if fname not in raw:
            choices[fname] = (default_choice(fname, model),)
            continue
        value = raw[fname]
        if isinstance(value, str) and value.strip().lower() == "auto":
            if fname == "num_gpus":
                raise space_error(fwhere, "`num_gpus: auto` is not supported; give a GPU count or a list of them")
            values = auto_values(fname, model, cluster, num_gpus, choices, gbs, uneven=uneven)
        elif isinstance(value, list):
            if not value:
                raise space_error(fwhere, "the list of values is empty; list at least one value, or use auto")
            values = tuple(normalize_value(fname, v, fwhere, gbs) for v in value)
        else:
            values = (normalize_value(fname, value, fwhere, gbs),)
        values = tuple(dict.fromkeys(values))  # drop repeats, keep order
        if not values:
            raise space_error(fwhere, "auto found no value that the rules allow for this model and cluster")
        choices[fname] = values
        if fname == "num_gpus":
            num_gpus = values
    check_model_values(model, choices, where)
    if "objectives" in data and "num_gpus" in objectives and len(choices["num_gpus"]) == 1:
        raise space_error(where, "the num_gpus objective needs `num_gpus` to list several GPU counts, but got "
                          f"(num_gpus={choices['num_gpus'][0]})")
    return SearchSpace(name=str(data.get("name") or name), model=model, cluster=cluster, global_batch_size=gbs,
                       precision=precision, objectives=tuple(objectives), choices=choices,
                       gpu_hour_cost=float(cost) if cost is not None else None, profile_path=profile_path,
                       memory_headroom_gib=float(headroom), safe_memory="memory_headroom_gib" not in data,
                       currency=currency.strip(),
                       source=source, description=str(data.get("description", "")), canonical_splits=uneven,
                       generated_layouts=is_auto(raw.get("pipeline_model_parallel_layout")))


def load_space(path: str | Path) -> SearchSpace:
    """Read a search-space YAML file (see the module docstring for its keys)."""
    path = Path(path)
    data = read_yaml(path, "search space")
    return space_from_dict(data, name=path.stem, base_dir=path.parent, source=str(path))


def with_overrides(space: SearchSpace, *, objectives: tuple[str, ...] | None = None,
                   gpu_hour_cost: float | None = None, name: str | None = None,
                   memory_headroom_gib: float | None = None, gpu_clock_mhz: float | None = None,
                   currency: str | None = None) -> SearchSpace:
    """The same space with command-line overrides applied (checked like the file's keys). ``gpu_clock_mhz``
    (--gpu-clock-mhz): the cluster's sustained clock; the space's name (its study's) says so."""
    changes = {}
    if objectives is not None:
        bad = [o for o in objectives if o not in OBJECTIVES]
        if bad or not objectives or len(set(objectives)) != len(objectives):
            raise ConfigError(f"`--objectives` must be distinct names from {list(OBJECTIVES)}, but got "
                              f"({','.join(objectives)})")
        if "num_gpus" in objectives and len(space.choices["num_gpus"]) == 1:
            raise ConfigError("the num_gpus objective needs the space to list several GPU counts under "
                              f"`num_gpus`, but got (num_gpus={space.choices['num_gpus'][0]})")
        changes["objectives"] = tuple(objectives)
    if gpu_hour_cost is not None:
        if gpu_hour_cost <= 0:
            raise ConfigError(f"`--gpu-hour-cost > 0` must hold, but got ({gpu_hour_cost})")
        changes["gpu_hour_cost"] = float(gpu_hour_cost)
    if name is not None:
        changes["name"] = name
    if memory_headroom_gib is not None:
        if memory_headroom_gib < 0:
            raise ConfigError(f"`--memory-headroom-gib >= 0` must hold, but got ({memory_headroom_gib})")
        space.cluster.gpu.check_headroom(memory_headroom_gib)
        changes["memory_headroom_gib"] = float(memory_headroom_gib)
        changes["safe_memory"] = False  # the user's headroom is the rule (SearchSpace.safe_memory)
    if gpu_clock_mhz is not None:
        if not 0 < gpu_clock_mhz < 10_000:
            raise ConfigError(f"`0 < --gpu-clock-mhz < 10000` must hold, but got ({gpu_clock_mhz})")
        changes["cluster"] = space.cluster.replace(sustained_clock_mhz=float(gpu_clock_mhz))
        changes["name"] = f"{changes.get('name', space.name)}-clock{gpu_clock_mhz:g}mhz"
    if currency is not None:
        if not currency.strip():
            raise ConfigError(f"`--currency` must be a name such as USD or EUR, but got ({currency!r})")
        changes["currency"] = currency.strip()
    return dataclasses.replace(space, **changes) if changes else space


def space_profile(space: SearchSpace):
    """The profile file the space names, loaded (None: the simulator takes the cluster's own)."""
    if space.profile_path is None:
        return None

    return load_profile(space.profile_path)
