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
own rules; this module only checks each value on its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.config.specs.cluster import PRECISIONS, ClusterSpec
from echo_tune.config.load.loading import (build, check_keys, cluster_from_dict, load_cluster, load_model, load_model_from,
                                      read_yaml)
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.config.flags.unmodelled import refuse_unmodelled_keys
from echo_tune.cost.profile import load_profile
from echo_tune.errors import ConfigError
from echo_tune.limits import LIMITS, check_number
from echo_tune.search.space.auto_values import auto_values
from echo_tune.search.space.fields import (BOOL_FIELDS, FIELD_ORDER, LAYOUT_FIELDS, MODEL_LAYOUT_FIELDS, MODULE_SET_FIELDS,
                                     NONE_WORDS, OPTIONAL_INT_FIELDS, WORD_FIELDS, module_choice, module_set)
from echo_tune.search.space.uneven import SPLIT_FIELDS
# Moved to auto_values.py, still imported from here (cli/search.py, users):
from echo_tune.search.space.auto_values import (AUTO_CAPS, MAX_CONTEXT_PARALLEL, MAX_MICRO_BATCH,  # noqa: F401
                                          MIN_TOKENS_PER_CP_RANK)

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


def _err(where: str, message: str) -> ConfigError:
    return ConfigError(f"{where}: {message}")


def resolve_ref(ref, base_dir: Path | None):
    """A preset name stays as is; a relative file path is taken relative to the space file if it exists there."""
    ref = str(ref)
    if base_dir is not None and (ref.endswith((".yaml", ".yml", ".json")) or "/" in ref):
        candidate = base_dir / ref
        if not Path(ref).is_absolute() and not Path(ref).exists() and candidate.exists():
            return str(candidate)
    return ref


def load_model_ref(value, where: str, base_dir: Path | None) -> ModelSpec:
    if isinstance(value, dict) and "from" in value:  # a preset or file with fields changed (config/load/loading.py)
        return load_model_from({**value, "from": resolve_ref(value["from"], base_dir)}, f"{where}: model")
    if isinstance(value, dict):
        return build(ModelSpec, {"name": "custom", **value}, f"{where}: model")
    if not isinstance(value, str):
        raise _err(where, f"`model` must be a preset name, a YAML file or a mapping, but got (model={value!r})")
    return load_model(resolve_ref(value, base_dir))


def load_cluster_ref(value, where: str, base_dir: Path | None) -> ClusterSpec:
    if isinstance(value, dict):
        return cluster_from_dict(value, name=str(value.get("name", "custom")), base_dir=base_dir)
    if not isinstance(value, str):
        raise _err(where, f"`cluster` must be a preset name, a YAML file or a mapping, but got (cluster={value!r})")
    return load_cluster(resolve_ref(value, base_dir))


def _positive_int(where: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise _err(where, f"`{name} > 0` must hold for an integer, but got ({name}={value!r})")
    try:
        check_number(name, value)  # the generous upper bounds of echo_tune.limits
    except ConfigError as exc:
        raise _err(where, str(exc)) from None
    return value


def _number(where: str, name: str, value) -> float:
    try:
        check_number(name, value)
    except ConfigError as exc:
        raise _err(where, str(exc)) from None
    return value


def _normalize(field_name: str, value, where: str, gbs: int):
    """One listed value, checked on its own (type and range), in ParallelConfig's form."""
    if field_name == "num_gpus":
        return _positive_int(where, "num_gpus", value)
    if isinstance(value, str) and value.strip().lower() in NONE_WORDS:
        value = None
    if field_name == "cuda_graph_impl" and value is None:  # "none" is the setting's own word for no graphs
        value = "none"
    if field_name in BOOL_FIELDS:
        if not isinstance(value, bool):
            raise _err(where, f"`{field_name}` takes true or false, but got ({field_name}={value!r})")
        return value
    if field_name == "virtual_pipeline_model_parallel_size" and value == 1:
        return None  # one chunk per stage: no interleaving
    if field_name in OPTIONAL_INT_FIELDS and value is None:
        return None
    if field_name in MODEL_LAYOUT_FIELDS:  # words checked against the model when the space is built
        if not isinstance(value, str):
            raise _err(where, f"`{field_name}` takes a word, but got ({field_name}={value!r})")
        return value
    if field_name in MODULE_SET_FIELDS:
        value = module_choice(value) if isinstance(value, (str, list, tuple)) or value is None else value
        if value is not None and not isinstance(value, str):
            raise _err(where, f"`{field_name}` takes module names joined by spaces or '+', such as "
                              f"mla_up_proj+mlp, but got ({field_name}={value!r})")
    try:
        ParallelConfig(global_batch_size=gbs, **{field_name: module_set(value) if field_name in MODULE_SET_FIELDS
                                                 else value})
        if field_name in LIMITS and isinstance(value, (int, float)) and not isinstance(value, bool):
            check_number(field_name, value)
    except ConfigError as exc:
        raise _err(where, str(exc)) from None
    if field_name not in WORD_FIELDS + MODULE_SET_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
        raise _err(where, f"`{field_name}` must be an integer, but got ({field_name}={value!r})")
    return value


def _is_auto(value) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def _default_choice(field_name: str, model: ModelSpec):
    if field_name == "num_gpus":
        raise AssertionError
    if field_name in MODEL_LAYOUT_FIELDS:  # the model's own setting
        return getattr(model, field_name)
    default = ParallelConfig.__dataclass_fields__[field_name].default
    return module_choice(default) if field_name in MODULE_SET_FIELDS else default


def _check_model_values(model: ModelSpec, choices: dict, where: str) -> None:
    """Each listed value of a model setting, checked on the model (one-line ConfigError)."""
    for fname in MODEL_LAYOUT_FIELDS:
        for value in choices[fname]:
            if value == getattr(model, fname):
                continue
            try:
                model.replace(**{fname: value})
            except ConfigError as exc:
                raise _err(f"{where} layout.{fname}", str(exc)) from None


def space_from_dict(data: dict, *, name: str = "space", base_dir: Path | None = None,
                    source: str = "") -> SearchSpace:
    """Build a SearchSpace from the mapping of a space file; one-line ConfigError for anything wrong."""
    where = f"search space {source or name!r}"
    check_keys(data, SPACE_KEYS, f"{where} top-level")
    missing = [k for k in ("model", "cluster", "num_gpus", "global_batch_size") if k not in data]
    if missing:
        raise _err(where, f"missing required key(s) {missing}")
    model = load_model_ref(data["model"], where, base_dir)
    cluster = load_cluster_ref(data["cluster"], where, base_dir)
    gbs = _positive_int(where, "global_batch_size", data["global_batch_size"])
    precision = data.get("precision", "bf16")
    if precision not in PRECISIONS:
        raise _err(where, f"`precision` must be one of {list(PRECISIONS)}, but got (precision={precision!r})")
    objectives = data.get("objectives", ["step_time"])
    objectives = [objectives] if isinstance(objectives, str) else objectives
    if not isinstance(objectives, list) or not objectives or any(o not in OBJECTIVES for o in objectives) \
            or len(set(objectives)) != len(objectives):
        raise _err(where, f"`objectives` must be distinct names from {list(OBJECTIVES)}, but got "
                          f"(objectives={data.get('objectives')!r})")
    cost = data.get("gpu_hour_cost")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, (int, float)) or not cost > 0):
        raise _err(where, f"`gpu_hour_cost > 0` must hold, but got (gpu_hour_cost={cost!r})")
    if cost is not None:
        _number(where, "gpu_hour_cost", cost)
    currency = data.get("currency", "USD")
    if not isinstance(currency, str) or not currency.strip():
        raise _err(where, f"`currency` must be a name such as USD or EUR, but got (currency={currency!r})")
    headroom = data.get("memory_headroom_gib", DEFAULT_MEMORY_HEADROOM_GIB)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not headroom >= 0:
        raise _err(where, f"`memory_headroom_gib >= 0` must hold, but got (memory_headroom_gib={headroom!r})")
    _number(where, "memory_headroom_gib", headroom)
    if "memory_headroom_gib" in data:  # as written (the default is for real GPUs; a toy one may be smaller)
        try:
            cluster.gpu.check_headroom(headroom, "memory_headroom_gib")
        except ConfigError as exc:
            raise _err(where, str(exc)) from None
    profile_path = None
    if data.get("profile") is not None:
        profile_path = Path(resolve_ref(data["profile"], base_dir))
    layout = data.get("layout") or {}
    if not isinstance(layout, dict):
        raise _err(where, f"`layout` must be a mapping of Megatron setting -> value(s), but got "
                          f"{type(layout).__name__}")
    refuse_unmodelled_keys(layout, LAYOUT_FIELDS, f"{where} layout")
    check_keys(layout, LAYOUT_FIELDS, f"{where} layout")

    raw = {"num_gpus": data["num_gpus"], **layout}
    uneven = any(_is_auto(raw.get(f)) for f in SPLIT_FIELDS)
    choices: dict[str, tuple] = {}
    num_gpus: tuple[int, ...] = ()
    for fname in FIELD_ORDER:  # auto for later fields may read earlier choices (vpp reads pp)
        fwhere = f"{where} {'layout.' if fname != 'num_gpus' else ''}{fname}"
        if fname not in raw:
            choices[fname] = (_default_choice(fname, model),)
            continue
        value = raw[fname]
        if isinstance(value, str) and value.strip().lower() == "auto":
            if fname == "num_gpus":
                raise _err(fwhere, "`num_gpus: auto` is not supported; give a GPU count or a list of them")
            values = auto_values(fname, model, cluster, num_gpus, choices, gbs, uneven=uneven)
        elif isinstance(value, list):
            if not value:
                raise _err(fwhere, "the list of values is empty; list at least one value, or use auto")
            values = tuple(_normalize(fname, v, fwhere, gbs) for v in value)
        else:
            values = (_normalize(fname, value, fwhere, gbs),)
        values = tuple(dict.fromkeys(values))  # drop repeats, keep order
        if not values:
            raise _err(fwhere, "auto found no value that the rules allow for this model and cluster")
        choices[fname] = values
        if fname == "num_gpus":
            num_gpus = values
    _check_model_values(model, choices, where)
    if "objectives" in data and "num_gpus" in objectives and len(choices["num_gpus"]) == 1:
        raise _err(where, "the num_gpus objective needs `num_gpus` to list several GPU counts, but got "
                          f"(num_gpus={choices['num_gpus'][0]})")
    return SearchSpace(name=str(data.get("name") or name), model=model, cluster=cluster, global_batch_size=gbs,
                       precision=precision, objectives=tuple(objectives), choices=choices,
                       gpu_hour_cost=float(cost) if cost is not None else None, profile_path=profile_path,
                       memory_headroom_gib=float(headroom), safe_memory="memory_headroom_gib" not in data,
                       currency=currency.strip(),
                       source=source, description=str(data.get("description", "")), canonical_splits=uneven,
                       generated_layouts=_is_auto(raw.get("pipeline_model_parallel_layout")))


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
