"""Megatron-LM command-line flags to and from echo-tune's spec fields (config/launch/megatron_flag_tables.py's tables).

It serves three uses: the CLI's layout flags, reading a pasted Megatron launch line
(``--megatron-args``), and writing the best layout back as flags (``megatron_args.txt``).

Every flag in MEGATRON_FLAGS exists in Megatron-LM's ``megatron/training/arguments.py``
(checked against NVIDIA/Megatron-LM main, 2024-2025; ``--num-virtual-stages-per-pipeline-rank`` is
the flag behind ``args.virtual_pipeline_model_parallel_size``).
"""

from __future__ import annotations

import dataclasses
import shlex

from echo_tune.config.flags.flag_catalog import spelling
from echo_tune.config.launch.launch_tokens import split_line
# The tables live in config/launch/megatron_flag_tables.py (config/flags/unmodelled.py reads them too); re-exported here.
from echo_tune.config.launch.megatron_flag_tables import (  # noqa: F401
    ALIASES, DEFAULT_ONLY_WITH, EXTRA_FLAGS, LINE_FLAGS, MEGATRON_FLAGS, MODEL_FLAGS, PARALLEL_FLAGS, SPECIAL_FLAGS)
from echo_tune.config.specs.layer_fields import LayerFields, parse_window_size
from echo_tune.config.specs.linear_attention_fields import LinearAttentionFields
from echo_tune.config.specs.moe_fields import MLAFields, MoEFields
from echo_tune.config.specs.optimizer_fields import OptimizerFields
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.config.specs.rebuild_fields import RebuildFields
from echo_tune.config.rules.launch_rules import launch_line_problems
from echo_tune.config.launch.line_flags import apply_line_flags
from echo_tune.config.flags.unmodelled import VALUE_RULES, refuse_if_unmodelled
from echo_tune.errors import ConfigError, raise_problems

# Fields written only when they differ from Megatron's default (the Muon settings: with --optimizer muon only).
_OPTIMIZER_DEFAULTS = {f.name: f.default for f in dataclasses.fields(OptimizerFields)
                       if f.name in ("optimizer", "muon_num_ns_steps", "muon_tp_mode", "muon_scalar_optimizer")}


def _convert(flag: str, kind: str, raw: str):
    if kind == "freq":  # --moe-layer-freq: an integer or a list expression
        return int(raw) if raw.strip().isdigit() else raw
    if kind == "window":
        return parse_window_size(raw)
    try:
        return {"int": int, "float": float, "str": str}[kind](raw)
    except ValueError:
        raise ConfigError(f"{flag} takes a{'n integer' if kind == 'int' else ' number'}, but got ({flag}={raw!r})") from None


def _arities(by_flag: dict) -> dict[str, int | str]:
    """Values each flag echo-tune reads takes (launch_tokens.split_line); the others come from the catalog."""
    kinds = {flag: 0 if kind in ("flag", "not_flag") else "+" if kind in ("list", "words", "ints") else 1
             for flag, (_, kind, _) in by_flag.items()}
    kinds |= {flag: "+" if count < 0 else count for flag, count in LINE_FLAGS.items()}
    return kinds | {flag: 0 for flag in SPECIAL_FLAGS}


def parse_megatron_line(line: str, *, base=None, megatron_lm: bool = False) -> tuple[dict, dict, str | None, list[str]]:
    """Read a Megatron launch line: (model fields, parallel fields, precision or None, ignored flags).

    ``base``: the ModelSpec the line is laid over (``--model``), whose own flags count as given (its
    ``--group-query-attention``). ``megatron_lm``: the line is a Megatron-LM launch line, held to the checks
    of Megatron-LM's arguments.py too (config/rules/launch_rules.py), which recipes run through Megatron-Core's
    configs (Megatron-Bridge, NeMo: the published-run rows) do not pass through.

    Flags that do not shape the step are returned as ignored; a flag that shapes the step but is not
    modelled, or is not a Megatron-LM flag (config/flags/flag_catalog.py), raises ``UnmodelledError`` naming it
    (config/flags/unmodelled.py). The line is split as Megatron-LM's argparse reads it (config/launch/launch_tokens.py),
    and every problem of the line is reported at once (errors.raise_problems)."""
    by_flag = {flag: (field, kind, "model") for field, (flag, kind) in MODEL_FLAGS.items()}
    by_flag |= {flag: (field, kind, "parallel") for field, (flag, kind) in PARALLEL_FLAGS.items()}
    by_flag |= {alias: (field, *((MODEL_FLAGS[field][1], "model") if field in MODEL_FLAGS
                                 else (PARALLEL_FLAGS[field][1], "parallel"))) for alias, field in ALIASES.items()}
    problems: list = []
    items = split_line(line, _arities(by_flag), problems)
    model, parallel, precisions, ignored, line_flags = {}, {}, [], [], {}
    present = {flag for flag, _ in items}
    for flag, values in items:
        if flag in ("--bf16", "--fp16"):
            precisions.append(flag[2:])
            continue
        if flag == "--checkpoint-activations":  # Megatron 2021 spelling of full, uniform recompute
            parallel["recompute_granularity"] = "full"
            ignored.append("--checkpoint-activations (Megatron 2021's spelling, read as full uniform recompute; "
                           "Megatron-LM since 2022 exits on it: write --recompute-granularity full "
                           "--recompute-method uniform --recompute-num-layers 1)")
            continue
        if flag in LINE_FLAGS:
            line_flags[flag] = list(values)
            continue
        if flag not in by_flag:
            if flag not in EXTRA_FLAGS:
                try:
                    refuse_if_unmodelled(flag, values)
                    ignored.append(flag)
                except ConfigError as exc:
                    problems.append(exc)
            continue
        field, kind, target = by_flag[flag]
        try:
            value = (kind == "flag" if kind in ("flag", "not_flag") else tuple(values) if kind == "list"
                     else " ".join(values) if kind == "words"
                     else tuple(_convert(flag, "int", v) for raw in values for v in raw.split()) if kind == "ints"
                     else _convert(flag, kind, values[0]))
        except ConfigError as exc:
            problems.append(exc)
            continue
        (model if target == "model" else parallel)[field] = value
    if len(set(precisions)) > 1:  # training/arguments.py validate_args: `if args.fp16: assert not args.bf16`
        problems.append(ConfigError("--bf16 and --fp16 cannot both be given (Megatron-LM asserts `not (fp16 and "
                                    "bf16)` in validate_args); keep one"))
    seq, max_positions = model.get("seq_length"), model.get("max_position_embeddings")
    if isinstance(max_positions, int) and isinstance(seq, int) and max_positions < seq:
        problems.append(ConfigError(f"`max_position_embeddings >= seq_length` must hold (Megatron-LM asserts it "
                                    f"in validate_args), but got (max_position_embeddings={max_positions}, "
                                    f"seq_length={seq}); raise --max-position-embeddings"))
    raise_problems(problems, "the Megatron launch line")
    if max_positions is not None and max_positions == seq:
        del model["max_position_embeddings"]  # the table fits the sequence: ModelSpec's default (None)
    if "--use-flash-attn" in present and "--attention-backend" in present:
        del model["use_flash_attn"]  # the line's backend decides: Megatron-LM d98e8a64ddf3 reads the old flag nowhere
        ignored.append(f"--use-flash-attn (beside --attention-backend {model['attention_backend']}, which decides; "
                       f"Megatron-LM d98e8a64ddf3 defines the old flag but reads it nowhere)")
    apply_line_flags(line_flags, model, parallel, ignored, base)
    if megatron_lm:
        raise_problems(launch_line_problems(present, model, parallel, base), "the Megatron launch line")
    return model, parallel, (precisions[0] if precisions else None), ignored


def _defaults(*classes) -> dict:
    return {f.name: f.default for cls in classes for f in dataclasses.fields(cls)}


_MOE_MLA_DEFAULTS = _defaults(MoEFields, MLAFields, LayerFields, LinearAttentionFields, RebuildFields) | {"mtp_num_layers": None} | {
    name: value for name, value in _defaults(ParallelConfig).items()
    if name in ("expert_model_parallel_size", "recompute_modules", "cuda_graph_impl", "cuda_graph_warmup_steps",
                "num_distributed_optimizer_instances", "cpu_offloading_num_layers", "cp_comm_type",
                "hierarchical_context_parallel_sizes")}


def to_megatron_flags(model_fields: dict, parallel_fields: dict, precision: str) -> list[str]:
    """Megatron-LM flags for a model and layout (defaults that Megatron shares are left out)."""
    out: list[str] = []
    if parallel_fields.get("recompute_granularity") == "full":
        # Megatron-Core's TransformerConfig refuses full recompute without both: write what was simulated
        # (check_compatible's default, Megatron 2021's --checkpoint-activations: uniform, one layer)
        parallel_fields = {**parallel_fields, "recompute_method": parallel_fields.get("recompute_method") or "uniform",
                           "recompute_num_layers": parallel_fields.get("recompute_num_layers") or 1}
    if model_fields.get("use_flash_attn") is not None:  # write the backend the legacy flag stood for
        model_fields = {**model_fields, "attention_backend": "flash" if model_fields["use_flash_attn"] else "unfused"}
    if parallel_fields.get("tensor_model_parallel_size", 1) == 1 and parallel_fields.get("tp_comm_overlap"):
        # a no-op at TP 1 (no TP communication: simulated without it), which Megatron-LM's arguments.py refuses
        # (sequence parallelism is turned off at TP 1, and --tp-comm-overlap asserts it)
        parallel_fields = {**parallel_fields, "tp_comm_overlap": False}
    for table, values in ((MODEL_FLAGS, model_fields), (PARALLEL_FLAGS, parallel_fields)):
        for field, (flag, kind) in table.items():
            value = values.get(field)
            if value is None or (kind == "flag" and not value) or (kind == "not_flag" and value):
                continue
            if field == "virtual_pipeline_model_parallel_size" and (value == 1 or values.get(
                    "pipeline_model_parallel_layout")):
                continue  # the layout sets VPP; arguments.py refuses both flags together
            if field in DEFAULT_ONLY_WITH and not values.get(DEFAULT_ONLY_WITH[field]):
                continue
            if field in _OPTIMIZER_DEFAULTS and value == _OPTIMIZER_DEFAULTS[field]:
                continue
            if field in _MOE_MLA_DEFAULTS and value == _MOE_MLA_DEFAULTS[field]:
                continue  # MoE / MLA / EP settings at Megatron's defaults (a dense model writes none)
            if kind in ("list", "ints"):
                out += [flag, *map(str, value)]
                continue
            if kind == "window":
                out += [flag, ",".join(map(str, value))]
                continue
            if kind == "freq" or field == "pipeline_model_parallel_layout":  # quoted for the shell: | ( ) *
                out += [flag, shlex.quote(str(value))]
                continue
            out += [flag] if kind in ("flag", "not_flag") else [flag, str(value)]
            if field == "use_flash_attn":
                continue  # the legacy spelling; attention_backend is written instead
            if field == "num_query_groups":
                if value == model_fields.get("num_attention_heads"):
                    del out[-2:]  # one group per head is multi-head attention, Megatron's default
                else:
                    out.insert(len(out) - 2, "--group-query-attention")
            if field == "seq_length" and model_fields.get("max_position_embeddings") is None:
                out += ["--max-position-embeddings", str(value)]  # Megatron requires it; the table fits s
    if precision in ("bf16", "fp16"):
        out.append(f"--{precision}")
    return out
