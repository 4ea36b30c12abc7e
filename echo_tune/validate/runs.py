"""Measured runs: read a runs CSV (Megatron argument names as columns) into simulator inputs.

Columns: every ModelSpec / ParallelConfig field by its Megatron name, plus ``name``, ``cluster`` (a
preset, or a cluster YAML path relative to the CSV), ``num_gpus``, ``precision``,
``measured_step_time_s`` and optionally ``source`` and ``assumptions``. A set column named after a
step-shaping Megatron setting echo-tune does not model (``fp8_format``, ...) refuses its row; other
unknown columns are ignored.
Megatron-LM flags written in ``assumptions`` (e.g. ``--overlap-grad-reduce``) are applied as assumed
settings where no column sets them, and reported. Then the dataset's errata (``validate/errata.py``:
settings the row's own source states, with file, commit and quote) where neither sets the field.
An optional ``model`` column (a preset, a model YAML or a config.json relative to the CSV) gives the row's
defaults, which all of the above override; a row without one that leaves out the norm, the position embedding,
tied embeddings, biases or the gated MLP is refused or lists Megatron's defaults as assumed
(``validate/run_models.py``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.io import read_csv_rows
from echo_tune.limits import MAX_RUN_ROWS, check_number
from echo_tune.config.load.loading import build, load_cluster
from echo_tune.config.launch.megatron_args import (ALIASES, LINE_FLAGS, MODEL_FLAGS, PARALLEL_FLAGS, SPECIAL_FLAGS,
                                            parse_megatron_line)
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.config.flags.unmodelled import STEP_SHAPING_FLAGS, UnmodelledError, harmless_reason, refusal, \
    refuse_if_unmodelled
from echo_tune.errors import ConfigError, EchoTuneError
from echo_tune.validate.datasets import is_published
from echo_tune.validate.errata import Erratum, errata_path_for, errata_settings, load_errata
from echo_tune.validate.run_models import ARCHITECTURE_COLUMNS, model_defaults, row_model, unstated_defaults
from echo_tune.config.launch.ub_config import read_ub_config

REQUIRED_COLUMNS = ("name", "cluster", "num_gpus", "measured_step_time_s", *ARCHITECTURE_COLUMNS, "global_batch_size")
MODEL_FIELDS = {f.name: f for f in dataclasses.fields(ModelSpec)}
PARALLEL_FIELDS = {f.name: f for f in dataclasses.fields(ParallelConfig)}


@dataclass(frozen=True, kw_only=True)
class RunCase:
    """One measured run, ready to simulate, or the reason it cannot be."""
    name: str
    source: str
    measured_step_time_s: float
    model: ModelSpec | None = None
    cluster: ClusterSpec | None = None
    num_gpus: int = 0
    parallel: ParallelConfig | None = None
    assumed_flags: tuple[str, ...] = ()
    errata: tuple[str, ...] = ()
    """Source-stated settings applied from the dataset's errata file, each with its source and quote."""
    defaults: tuple[str, ...] = ()
    """Megatron defaults of the step-shaping architecture fields the row (without a ``model``) leaves out."""
    error: str | None = None


def _value(column: str, raw: str, annotation: str):
    """Parse one cell by its field's type; empty cells mean "not set"."""
    text = raw.strip()
    if text == "":
        return None
    if column == "tp_comm_overlap_cfg":  # the userbuffer settings file, read as the launch line reads it

        return None if text.lower() == "none" else read_ub_config(text)
    if column == "cp_comm_type":  # nargs="+" read into words; Megatron's dump prints the list: "['p2p']"
        return " ".join(t.strip("'\"") for t in re.split(r"[\s,;]+", text.strip("()[] ")) if t.strip("'\""))
    if annotation.startswith("tuple"):  # window_size, recompute_modules: "64,0", "(64, 0)", "core_attn mlp",
        # or as Megatron's argument dump prints a list: "['core_attn', 'mlp']"
        items = [t.strip("'\"") for t in re.split(r"[\s,;]+", text.strip("()[] ")) if t.strip("'\"")]
        if text.lower() == "none" or not items:
            return None
        if annotation.startswith("tuple[int"):
            try:
                return tuple(int(t) for t in items)
            except ValueError:
                raise ConfigError(f"column {column!r} must hold integers separated by commas or spaces (e.g. 64,0), "
                                  f"but got {text!r}") from None
        return tuple(items)
    if "bool" in annotation:
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
    elif "int" in annotation:
        try:
            return int(text)
        except ValueError:
            if "str" in annotation:  # moe_layer_freq: an integer or a list expression
                return text
    elif "float" in annotation:
        try:
            return float(text)
        except ValueError:
            pass
    elif "str" in annotation:
        return None if column == "recompute_granularity" and text.lower() == "none" else text
    kind = next(k for k in ("bool", "int", "float", "str") if k in annotation)
    wanted = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "text"}[kind]
    raise ConfigError(f"column {column!r} must hold {wanted}, but got {text!r}")


READ_FLAGS = frozenset(LINE_FLAGS) | frozenset(SPECIAL_FLAGS) | frozenset(ALIASES)


def _fields(row: dict, table: dict) -> dict:
    return {name: value for name in table if name in row
            and (value := _value(name, row[name], str(table[name].type))) is not None}


def _assumed(row: dict, model_fields: dict, parallel_fields: dict) -> tuple[dict, dict, list[str]]:
    """Megatron flags in the assumptions text, for fields no column sets."""
    text = row.get("assumptions") or ""
    tokens = [t.strip(";,.()") for t in text.replace(",", " ").split()]
    kinds = {flag: kind for flag, kind in (*MODEL_FLAGS.values(), *PARALLEL_FLAGS.values())}
    kept = []  # the flags, and the value after a flag that takes one (--exp-avg-dtype bf16)
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            if token not in kinds and token not in READ_FLAGS:  # prose, not a launch line: a flag named
                refuse_if_unmodelled(token, tuple(_until_flag(tokens[i + 1:])))  # without its value is judged
                continue                                               # alone (harmless: dropped)
            kept.append(token)
            if kinds.get(token) in ("int", "float", "str", "freq", "window") and i + 1 < len(tokens):
                kept.append(tokens[i + 1])
            elif kinds.get(token) in ("list", "words", "ints"):  # nargs="+": the values up to the next flag or "|"
                kept += [t for t in _until_flag(tokens[i + 1:])]
    model_extra, parallel_extra, _, _ = parse_megatron_line(" ".join(kept)) if kept else ({}, {}, None, [])
    model_extra = {k: v for k, v in model_extra.items() if k not in model_fields}
    parallel_extra = {k: v for k, v in parallel_extra.items() if k not in parallel_fields}
    flags = sorted(f"--{k.replace('_', '-')}" for k in {**model_extra, **parallel_extra})
    return model_extra, parallel_extra, flags


def _until_flag(tokens: list[str]) -> list[str]:
    out = []
    for token in tokens:
        if token.startswith("--") or token == "|" or not token:
            break
        out.append(token)
    return out


def _refused_columns(row: dict) -> None:
    """A column named after a Megatron setting echo-tune does not model refuses the row when it is set
    (non-empty and not false): the run's step depends on it (config/flags/unmodelled.py)."""
    for column, raw in row.items():
        if column in MODEL_FIELDS or column in PARALLEL_FIELDS or column is None:
            continue
        text = (raw or "").strip()
        if text and text.lower() not in ("false", "0", "no", "none"):
            flag = "--" + column.replace("_", "-")
            if refusal(flag) is not None and harmless_reason(flag) is None and flag in STEP_SHAPING_FLAGS:
                refuse_if_unmodelled(flag, (text,))


def case_from_row(row: dict, base_dir: Path, errata: dict[str, tuple[Erratum, ...]], *,
                  models: dict | None = None, grandfathered: bool = False) -> RunCase:
    """One row of a runs CSV as a RunCase (its errata applied; paths relative to ``base_dir``). ``models``: a
    cache of the ``model`` column's models; ``grandfathered``: a shipped published-run set (run_models.py)."""
    name = row["name"].strip()
    measured = _value("measured_step_time_s", row["measured_step_time_s"], "float")
    if measured is None:
        raise ConfigError(f"row {name!r}: `measured_step_time_s > 0` must hold, but got {row['measured_step_time_s']!r}")
    try:
        check_number("measured_step_time_s", measured)  # NaN, inf, <= 0, over a day: issue 10
    except ConfigError as exc:
        raise ConfigError(f"row {name!r}: {exc}") from None
    common = dict(name=name, source=(row.get("source") or "").strip() or "unknown", measured_step_time_s=measured)
    try:
        _refused_columns(row)
        model_fields, parallel_fields = _fields(row, MODEL_FIELDS), _fields(row, PARALLEL_FIELDS)
        model_extra, parallel_extra, flags = _assumed(row, model_fields, parallel_fields)
        taken = {*model_fields, *parallel_fields, *model_extra, *parallel_extra}
        model_errata, parallel_errata, applied = errata_settings(errata.get(name, ()), taken)
        model_extra, parallel_extra = {**model_extra, **model_errata}, {**parallel_extra, **parallel_errata}
        # a correction overrides its column (errata.py: only where the row's own values cannot all hold)
        model_fields = {k: v for k, v in model_fields.items() if k not in model_errata}
        parallel_fields = {k: v for k, v in parallel_fields.items() if k not in parallel_errata}
        parallel = build(ParallelConfig, {**parallel_fields, **parallel_extra}, f"row {name!r} layout")
        ref = (row.get("model") or "").strip()
        if ref:  # the model's fields are the row's defaults: columns, flags and errata override them
            base = model_defaults(row_model(ref, base_dir, model_fields.get("seq_length"),
                                            {} if models is None else models))
        else:
            base = {}
            lacking = [c for c in ARCHITECTURE_COLUMNS if c not in model_fields]
            if lacking and "model" in row:  # a CSV with a `model` column, this row's cell empty
                raise ConfigError(f"row {name!r} names no model and leaves {lacking} empty; fill its `model` cell (a "
                                  f"preset, a model YAML or a config.json) or those columns")
        if ({**base, **model_fields}.get("num_experts") and "add_bias_linear" not in {**model_fields, **model_extra}
                and base.get("add_bias_linear", True) and parallel.expert_tensor_size > 1):
            # the run ran, and Megatron refuses MoE biases with ETP > 1 (transformer_config.py): no biases
            model_extra["add_bias_linear"] = False
            flags.append("--disable-bias-linear (implied by MoE with expert_tensor_parallel_size > 1)")
        defaults = () if ref else unstated_defaults(name, {**model_fields, **model_extra}, grandfathered=grandfathered)
        model = build(ModelSpec, {**base, **model_fields, **model_extra, "name": name}, f"row {name!r} model")
        ref = row["cluster"].strip()
        cluster = load_cluster(base_dir / ref if ref.endswith((".yaml", ".yml")) else ref)
        num_gpus = _value("num_gpus", row["num_gpus"], "int")
        return RunCase(**common, model=model, cluster=cluster, num_gpus=num_gpus, parallel=parallel,
                       assumed_flags=tuple(flags), errata=tuple(applied), defaults=defaults)
    except UnmodelledError as exc:
        return RunCase(**common, error=f"refused: {exc}")
    except EchoTuneError as exc:
        return RunCase(**common, error=str(exc))


def read_runs(path: str | Path, errata: bool | str | Path = True) -> list[RunCase]:
    """Read a runs CSV. A missing file or column is an error; a row that breaks a rule is kept with it.

    ``errata``: True applies the dataset's errata file if there is one (``errata/<csv stem>.yaml``), a path
    applies that file, False none."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"runs file {str(path)!r} does not exist; give a CSV like "
                          f"calibration/published-runs/runs_megatron.csv")
    columns, rows = read_csv_rows(path, "runs file")  # BOM, short rows, non-UTF-8: one-line errors
    missing = [c for c in REQUIRED_COLUMNS if c not in columns and not ("model" in columns
                                                                      and c in ARCHITECTURE_COLUMNS)]
    if missing:
        raise ConfigError(f"runs file {str(path)!r} is missing required column(s) {missing}; "
                          f"columns are Megatron argument names plus name, cluster, num_gpus, "
                          f"measured_step_time_s (and optionally model, whose fields give the architecture)")
    if not rows:
        raise ConfigError(f"runs file {str(path)!r} has a header but no rows")
    if len(rows) > MAX_RUN_ROWS:  # each row is a full simulation: bounded time, refused before any is run
        raise ConfigError(f"runs file {str(path)!r} has {len(rows):,} rows; `rows <= {MAX_RUN_ROWS:,}` must hold "
                          f"(each row is one simulation, ~0.1-0.5 s); split the file")
    if errata is True:
        errata = errata_path_for(path) or False
    table = load_errata(errata) if errata else {}

    models: dict = {}  # one model file read once, not once per row
    grandfathered = is_published(path)
    seen: dict[str, int] = {}
    for number, row in enumerate(rows, start=2):  # the header is line 1
        name = (row.get("name") or "").strip()
        if name in seen:
            raise ConfigError(f"runs file {str(path)!r}: run names must be unique (each is one measured run), but "
                              f"{name!r} is on lines {seen[name]} and {number}; rename one or drop the copy")
        seen[name] = number
    return [case_from_row(row, path.parent, table, models=models, grandfathered=grandfathered) for row in rows]
