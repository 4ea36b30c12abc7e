"""Load models, GPUs and clusters from presets or YAML files, with one-line errors for bad input."""

from __future__ import annotations

import dataclasses
import functools
from importlib import resources
from pathlib import Path

import yaml

from echo_tune.config.specs.cluster import ClusterSpec, GPUSpec
from echo_tune.config.load.hf_config import load_hf_config
from echo_tune.config.specs.model import ModelSpec
# Building a spec from a mapping lives in config/load/spec_build.py (config/load/hf_config.py builds with it too).
from echo_tune.config.load.spec_build import build, check_keys, read_yaml  # noqa: F401
from echo_tune.errors import ConfigError, raise_problems

CLUSTER_KEYS = ("name", "gpu", "gpus_per_node", "intra_node_bandwidth_gbyte_s", "nics_per_node",
                "nic_bandwidth_gbit_s", "nvlink_domain_size", "nodes_per_leaf",
                "spine_oversubscription", "profile", "sustained_clock_mhz", "source")


# Short names a user types for a GPU or cluster preset (the SXM boards are the training parts).
PRESET_ALIASES = {"h100": "h100-sxm", "h200": "h200-sxm", "h800": "h800-sxm", "gb200": "gb200-nvl72", "gb300": "gb300-nvl72"}


@functools.cache
def _preset_table(kind: str) -> dict[str, dict]:
    text = resources.files("echo_tune.config").joinpath("presets", f"{kind}.yaml").read_text()
    return {k: v for k, v in yaml.safe_load(text).items() if not k.startswith("_")}


def preset_names(kind: str) -> list[str]:
    """Names of the shipped presets of ``kind`` ("models", "gpus" or "clusters")."""
    return sorted(_preset_table(kind))


def _is_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml", ".json")) or "/" in ref


def load_model(ref: str | Path) -> ModelSpec:
    """A model preset name (``gpt3-175b``), a YAML file of ModelSpec fields or a Hugging Face config.json."""
    ref = str(ref)
    if ref.endswith(".json"):
        return load_hf_config(ref)
    if _is_path(ref):
        data = read_yaml(Path(ref), "model")
        data.setdefault("name", Path(ref).stem)
        return build(ModelSpec, data, "model")
    table = _preset_table("models")
    if ref not in table:
        raise ConfigError(f"unknown model preset {ref!r}; choose one of {preset_names('models')} or give a YAML file")
    return build(ModelSpec, {"name": ref, **table[ref]}, "model")


def load_model_from(data: dict, what: str = "model") -> ModelSpec:
    """``{from: <preset, YAML file or config.json>, <field>: <value>, ...}``: the model with those fields
    changed; a config.json is read at the ``seq_length`` given (the way a space or rank file states the
    training length of a config.json that has none)."""
    data = dict(data)
    ref = data.pop("from")
    if not isinstance(ref, str):
        raise ConfigError(f"{what}: `from` must name a preset, a YAML file or a config.json, but got (from={ref!r})")
    if ref.endswith(".json"):
        seq = data.get("seq_length")
        base = load_hf_config(ref, seq_length=seq if isinstance(seq, int) and not isinstance(seq, bool) else None)
    else:
        base = load_model(ref)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    return build(ModelSpec, {**fields, **data}, what) if data else base


def load_gpu(ref: str | dict, where: str = "") -> GPUSpec:
    if isinstance(ref, dict):
        return build(GPUSpec, ref, f"{where}: gpu" if where and where != "cluster" else "gpu")
    table = _preset_table("gpus")
    ref = ref if ref in table else PRESET_ALIASES.get(ref, ref)
    if ref not in table:
        raise ConfigError(f"unknown GPU preset {ref!r}; choose one of {preset_names('gpus')}")
    return build(GPUSpec, {"name": ref, **table[ref]}, "gpu")


def cluster_from_dict(data: dict, *, name: str, base_dir: Path | None = None, what: str = "cluster") -> ClusterSpec:
    """Build a ClusterSpec from the keys of a cluster file; ``profile`` is resolved against ``base_dir``; ``what``
    names it in errors (a file's path)."""
    check_keys(data, CLUSTER_KEYS, "cluster")
    data = dict(data)
    data.setdefault("name", name)
    if "gpu" not in data:
        raise ConfigError(f"cluster {name!r} is missing required key 'gpu' (a GPU preset: {preset_names('gpus')})")
    problems = []
    if not isinstance(data["gpu"], (str, dict)):
        problems.append(f"cluster {name!r}: `gpu` must be a GPU preset name or a mapping of GPU keys, but got "
                        f"(gpu={data['gpu']!r}); write e.g. `gpu: a100-80gb`")
    if data.get("profile") is not None and not isinstance(data["profile"], str):
        problems.append(f"cluster {name!r}: `profile` must be the path of a profile YAML file, but got "
                        f"(profile={data['profile']!r}); write e.g. `profile: profile.yaml`")
    raise_problems(problems, f"cluster {name!r}")
    try:
        data["gpu"] = load_gpu(data["gpu"], what)
        if data.get("profile") is not None:
            profile = Path(data["profile"])
            data["profile"] = profile if profile.is_absolute() or base_dir is None else base_dir / profile
        return build(ClusterSpec, data, what)
    except ConfigError as exc:  # a rule between keys (a clock over the GPU's peak): still named by its file
        if what == "cluster" or what in str(exc):
            raise
        raise type(exc)(f"{what}: {exc}") from None


def load_cluster(ref: str | Path) -> ClusterSpec:
    """A cluster preset name (``a100-80gb``) or a YAML file with the cluster keys."""
    ref = str(ref)
    if _is_path(ref):
        path = Path(ref)
        return cluster_from_dict(read_yaml(path, "cluster"), name=path.stem, base_dir=path.parent,
                                 what=f"cluster file {str(path)!r}")
    table = _preset_table("clusters")
    ref = PRESET_ALIASES.get(ref, ref)
    if ref not in table:
        raise ConfigError(f"unknown cluster preset {ref!r}; choose one of {preset_names('clusters')} "
                          f"or give a YAML file")
    return cluster_from_dict(table[ref], name=ref)
