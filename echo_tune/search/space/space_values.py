"""A search-space file's values, each checked on its own: the model and cluster it names (a preset, a file relative to
the space file, or a mapping), the numbers, and each listed layout value in ParallelConfig's form. Which combinations
are valid is decided in ``layouts.py``; the space itself is built in ``search_space.py``."""

from __future__ import annotations

from pathlib import Path

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.load.loading import build, cluster_from_dict, load_cluster, load_model, load_model_from
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.errors import ConfigError
from echo_tune.limits import LIMITS, check_number
from echo_tune.search.space.fields import (BOOL_FIELDS, MODEL_LAYOUT_FIELDS, MODULE_SET_FIELDS, NONE_WORDS,
                                           OPTIONAL_INT_FIELDS, WORD_FIELDS, module_choice, module_set)


def space_error(where: str, message: str) -> ConfigError:
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
        raise space_error(where, f"`model` must be a preset name, a YAML file or a mapping, but got (model={value!r})")
    return load_model(resolve_ref(value, base_dir))


def load_cluster_ref(value, where: str, base_dir: Path | None) -> ClusterSpec:
    if isinstance(value, dict):
        return cluster_from_dict(value, name=str(value.get("name", "custom")), base_dir=base_dir)
    if not isinstance(value, str):
        raise space_error(where, f"`cluster` must be a preset name, a YAML file or a mapping, but got (cluster={value!r})")
    return load_cluster(resolve_ref(value, base_dir))


def positive_int(where: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise space_error(where, f"`{name} > 0` must hold for an integer, but got ({name}={value!r})")
    try:
        check_number(name, value)  # the generous upper bounds of echo_tune.limits
    except ConfigError as exc:
        raise space_error(where, str(exc)) from None
    return value


def checked_number(where: str, name: str, value) -> float:
    try:
        check_number(name, value)
    except ConfigError as exc:
        raise space_error(where, str(exc)) from None
    return value


def normalize_value(field_name: str, value, where: str, gbs: int):
    """One listed value, checked on its own (type and range), in ParallelConfig's form."""
    if field_name == "num_gpus":
        return positive_int(where, "num_gpus", value)
    if isinstance(value, str) and value.strip().lower() in NONE_WORDS:
        value = None
    if field_name == "cuda_graph_impl" and value is None:  # "none" is the setting's own word for no graphs
        value = "none"
    if field_name in BOOL_FIELDS:
        if not isinstance(value, bool):
            raise space_error(where, f"`{field_name}` takes true or false, but got ({field_name}={value!r})")
        return value
    if field_name == "virtual_pipeline_model_parallel_size" and value == 1:
        return None  # one chunk per stage: no interleaving
    if field_name in OPTIONAL_INT_FIELDS and value is None:
        return None
    if field_name in MODEL_LAYOUT_FIELDS:  # words checked against the model when the space is built
        if not isinstance(value, str):
            raise space_error(where, f"`{field_name}` takes a word, but got ({field_name}={value!r})")
        return value
    if field_name in MODULE_SET_FIELDS:
        value = module_choice(value) if isinstance(value, (str, list, tuple)) or value is None else value
        if value is not None and not isinstance(value, str):
            raise space_error(where, f"`{field_name}` takes module names joined by spaces or '+', such as "
                              f"mla_up_proj+mlp, but got ({field_name}={value!r})")
    try:
        ParallelConfig(global_batch_size=gbs, **{field_name: module_set(value) if field_name in MODULE_SET_FIELDS
                                                 else value})
        if field_name in LIMITS and isinstance(value, (int, float)) and not isinstance(value, bool):
            check_number(field_name, value)
    except ConfigError as exc:
        raise space_error(where, str(exc)) from None
    if field_name not in WORD_FIELDS + MODULE_SET_FIELDS and (isinstance(value, bool) or not isinstance(value, int)):
        raise space_error(where, f"`{field_name}` must be an integer, but got ({field_name}={value!r})")
    return value


def is_auto(value) -> bool:
    return isinstance(value, str) and value.strip().lower() == "auto"


def default_choice(field_name: str, model: ModelSpec):
    if field_name == "num_gpus":
        raise AssertionError
    if field_name in MODEL_LAYOUT_FIELDS:  # the model's own setting
        return getattr(model, field_name)
    default = ParallelConfig.__dataclass_fields__[field_name].default
    return module_choice(default) if field_name in MODULE_SET_FIELDS else default


def check_model_values(model: ModelSpec, choices: dict, where: str) -> None:
    """Each listed value of a model setting, checked on the model (one-line ConfigError)."""
    for fname in MODEL_LAYOUT_FIELDS:
        for value in choices[fname]:
            if value == getattr(model, fname):
                continue
            try:
                model.replace(**{fname: value})
            except ConfigError as exc:
                raise space_error(f"{where} layout.{fname}", str(exc)) from None
