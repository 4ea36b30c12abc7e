"""A runs CSV's architecture: the optional ``model`` column, and the settings a row leaves to Megatron's defaults.

``model`` names a model preset (``echo-tune presets``), a model YAML or a Hugging Face config.json (a path
relative to the CSV). Its fields are the row's defaults; the row's own columns, then the Megatron flags of its
``assumptions`` column, then its dataset's errata override them (``validate/runs.py``). A config.json that states
no training length is read at the row's ``seq_length``.

A row without a model gets what it leaves out from Megatron's defaults, which are GPT-3's (``ModelSpec``). Five of
them change the step substantially (``ARCHITECTURE_DEFAULTS``): the norm, the position embedding, tied embeddings,
biases and the gated MLP. Where a row leaves some of them out:

- a row that describes anything but a GPT-3-like model (one of the five set away from its default, grouped-query
  attention, experts, MLA) is **refused**, naming the fields and the fix: GPT-3's defaults would silently be
  simulated for, e.g., a Llama row that states ``swiglu`` but not its RMSNorm and RoPE;
- a GPT-3-like row keeps them, and they are **listed as assumed** in the row (``RunCase.defaults``), which
  ``calibrate fit --runs`` prints, with the lesser defaults it takes (``LISTED_DEFAULTS``: MLP width, dropout);
- the shipped published-run sets (``calibration/published-runs/``, byte for byte) predate the rule: their
  rows are never refused by it, only listed (their ``assumptions`` column says which values the source states).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from echo_tune.config.load.hf_config import load_hf_config
from echo_tune.config.load.loading import load_model
from echo_tune.config.specs.model import ModelSpec
from echo_tune.errors import ConfigError

ARCHITECTURE_COLUMNS = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size")
"""Required columns of a runs CSV without a ``model`` column (with one, the model gives them)."""
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelSpec)}
ARCHITECTURE_DEFAULTS = {
    "normalization": f"--normalization {_DEFAULTS['normalization']}",
    "position_embedding_type": f"--position-embedding-type {_DEFAULTS['position_embedding_type']}",
    "untie_embeddings_and_output_weights": "tied embeddings (no --untie-embeddings-and-output-weights)",
    "add_bias_linear": "biases (no --disable-bias-linear)",
    "swiglu": "GeLU MLP (no --swiglu)",
}
"""The fields that change the step substantially, each with how Megatron's default reads on a launch line."""
LISTED_DEFAULTS = {
    "ffn_hidden_size": "ffn_hidden_size 4 x hidden_size (2/3 of it with --swiglu)",
    "hidden_dropout": f"--hidden-dropout {_DEFAULTS['hidden_dropout']}",
    "attention_dropout": f"--attention-dropout {_DEFAULTS['attention_dropout']}",
}
"""Defaults that change the step less (the MLP's width, the dropout kernels): listed where a row without a model
leaves them out, never refused."""


def _is_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml", ".json")) or "/" in ref


def row_model(ref: str, base_dir: Path, seq_length: int | None, cache: dict) -> ModelSpec:
    """The model a row's ``model`` cell names (a preset, or a YAML / config.json path relative to the CSV)."""
    key = (ref, seq_length if ref.endswith(".json") else None)
    if key in cache:
        return cache[key]
    if _is_path(ref):
        path = Path(ref) if Path(ref).is_absolute() else base_dir / ref
        if not path.is_file():
            raise ConfigError(f"column 'model': {ref!r} is not a file beside the CSV ({str(path)!r}); give a model "
                              f"preset (`echo-tune presets`), or a model YAML or config.json path relative to the CSV")
        if ref.endswith(".json"):
            spec = load_hf_config(path, seq_length=seq_length)
        else:
            spec = load_model(path)
    else:
        spec = load_model(ref)  # an unknown preset: one line listing the presets
    cache[key] = spec
    return spec


def model_defaults(spec: ModelSpec) -> dict:
    """Every field of ``spec`` but its name: a row's defaults, which its columns and flags override."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "name"}


def _not_gpt3(stated: dict) -> list[str]:
    """What in a row's stated model fields is not GPT-3-like (as ``name=value``)."""
    out = [f"{k}={stated[k]}" for k in ARCHITECTURE_DEFAULTS if k in stated and stated[k] != _DEFAULTS[k]]
    groups, heads = stated.get("num_query_groups"), stated.get("num_attention_heads")
    if groups is not None and groups != heads:
        out.append(f"num_query_groups={groups}")
    out += [f"{k}={stated[k]}" for k in ("num_experts", "multi_latent_attention") if stated.get(k)]
    return out


def unstated_defaults(name: str, stated: dict, *, grandfathered: bool) -> tuple[str, ...]:
    """The Megatron defaults a row without a model relies on, as launch-line text; raises when the row is not
    GPT-3-like (see the module docstring). ``stated``: the row's model fields from its columns, its
    ``assumptions`` flags and its errata; ``grandfathered``: a shipped published-run set (listed, never refused)."""
    missing = [k for k in ARCHITECTURE_DEFAULTS if k not in stated]
    reasons = _not_gpt3(stated)
    if missing and reasons and not grandfathered:
        raise ConfigError(
            f"row {name!r} states {', '.join(reasons)} but not {', '.join(missing)}, which would take Megatron's "
            f"GPT-3 defaults ({'; '.join(ARCHITECTURE_DEFAULTS[k] for k in missing)}); add a `model` column "
            f"(a preset, a model YAML or a config.json) or the column(s) {', '.join(missing)} (or their flags "
            f"after `flags:` in `assumptions`)")
    return tuple(ARCHITECTURE_DEFAULTS[k] for k in missing) + \
        tuple(text for k, text in LISTED_DEFAULTS.items() if k not in stated)
