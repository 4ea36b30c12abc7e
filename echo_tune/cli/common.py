"""Pieces the subcommands share: Megatron layout flags, spec building, JSON and table output."""

from __future__ import annotations

import argparse
import json
import sys

from echo_tune.cli.field_help import choices_of, help_for
from echo_tune.config._checks import require
from echo_tune.config.load.hf_config import hf_notes, load_hf_config
from echo_tune.config.load.loading import build, load_model
from echo_tune.config.launch.line_flags import drop_unused_recompute
from echo_tune.config.launch.megatron_args import ALIASES, MODEL_FLAGS, PARALLEL_FLAGS, parse_megatron_line
from echo_tune.config.specs.model import ModelSpec
from echo_tune.errors import ConfigError
from echo_tune.config.specs.parallel import ParallelConfig

PRECISION_FLAGS = {"bf16": "--bf16", "fp16": "--fp16", "fp32": "--fp32"}


def _freq(raw: str) -> int | str:
    """--moe-layer-freq: an integer or a list expression such as ([0]*3+[1]*58)."""
    return int(raw) if raw.strip().isdigit() else raw


def _add_flag(parser: argparse.ArgumentParser, field: str, flag: str, kind: str, extra: tuple[str, ...] = ()) -> None:
    text = help_for(field, flag)
    choices = choices_of(field)
    metavar = "{" + ",".join(choices) + "}" if choices else field.upper()
    if kind == "flag":
        parser.add_argument(flag, *extra, dest=field, action="store_const", const=True, default=None, help=text)
    elif kind == "not_flag":
        parser.add_argument(flag, dest=field, action="store_const", const=False, default=None, help=text)
    elif kind == "list":
        parser.add_argument(flag, *extra, dest=field, nargs="+", default=None, metavar=field.upper(), help=text)
    elif kind == "ints":  # nargs="+", type=int (--hierarchical-context-parallel-sizes)
        parser.add_argument(flag, *extra, dest=field, nargs="+", type=int, default=None, metavar="N", help=text)
    elif kind == "words":  # nargs="+" read as one space-separated value (--moe-router-load-balancing-type)
        parser.add_argument(flag, *extra, dest=field, nargs="+", default=None, metavar=metavar, help=text,
                            action=_JoinedWords)
    else:
        parser.add_argument(flag, *extra, dest=field, type={"int": int, "float": float, "str": str, "freq": _freq, "window": str}[kind],
                            default=None, metavar=metavar, help=text)


class _JoinedWords(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, " ".join(values))


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    """Every model and layout setting as its Megatron-LM flag, plus --megatron-args."""
    layout = parser.add_argument_group("parallel layout (Megatron-LM flags)")
    for field, (flag, kind) in PARALLEL_FLAGS.items():
        extra = tuple(alias for alias, target in ALIASES.items() if target == field)
        _add_flag(layout, field, flag, kind, extra)
    precision = layout.add_mutually_exclusive_group()
    for name, flag in PRECISION_FLAGS.items():
        precision.add_argument(flag, dest="precision", action="store_const", const=name, default=None,
                               help=f"train in {name}" + (" (default)" if name == "bf16" else ""))
    overrides = parser.add_argument_group("model overrides (Megatron-LM flags; change the --model preset)")
    for field, (flag, kind) in MODEL_FLAGS.items():
        _add_flag(overrides, field, flag, kind, tuple(alias for alias, target in ALIASES.items() if target == field))
    overrides.add_argument("--moe-routing-imbalance", dest="moe_routing_imbalance", type=float, default=None,
                           metavar="FACTOR", help="echo-tune's routing assumption, not a Megatron flag: the busiest "
                                                  "expert's token share relative to balanced (default 1)")
    parser.add_argument("--megatron-args", metavar="LINE",
                        help="a pasted Megatron-LM launch line; its model and layout flags are read, harmless ones "
                             "ignored with a note, unmodelled step-shaping or unknown ones refused")


def add_clock_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-clock-mhz", type=float, default=None, metavar="MHZ",
                        help="SM clock the GPUs sustain on compute-bound kernels (e.g. nvidia-smi during training); "
                             "overrides the cluster's sustained_clock_mhz, a fitted profile's and the GPU preset's")


def with_clock(cluster, args: argparse.Namespace):
    """The cluster with --gpu-clock-mhz applied (checked by ClusterSpec: > 0, the GPU states its peak clock)."""
    clock = getattr(args, "gpu_clock_mhz", None)
    return cluster if clock is None else build_cluster_clock(cluster, clock)


def build_cluster_clock(cluster, clock: float):
    require(clock == clock and 0 < clock < 10_000, f"`0 < --gpu-clock-mhz < 10000` must hold, but got ({clock})")
    return cluster.replace(sustained_clock_mhz=float(clock))


def specs_from_args(args: argparse.Namespace, *, default_model: str | None = "gpt3-175b",
                    default_global_batch_size: int | None = None) -> tuple[ModelSpec, ParallelConfig, list[str]]:
    """Model and layout from --model, --megatron-args and explicit flags (explicit flags win)."""
    notes: list[str] = []
    model_fields, parallel_fields, precision = {}, {}, None
    # A pasted Megatron line describes its own model (Megatron's defaults fill the rest), unless
    # --model names a preset or file to start from.
    model_ref = getattr(args, "model", None) or (None if args.megatron_args is not None else default_model)
    base = None
    if args.megatron_args is not None:  # an empty line reaches the parser, which refuses it
        if model_ref is not None:  # the line is laid over the model: read with it (its own flags count as given)
            seq = parse_megatron_line(args.megatron_args)[0].get("seq_length")
            base = _base_model(model_ref, getattr(args, "seq_length", None) or seq)
        model_fields, parallel_fields, precision, ignored = parse_megatron_line(args.megatron_args, base=base,
                                                                                megatron_lm=True)
        if ignored:
            notes.append(f"ignored {len(ignored)} Megatron flag(s) that do not shape the step: {' '.join(ignored)}")
        if precision is None:
            precision = "fp32"
            notes.append("the Megatron line has neither --bf16 nor --fp16: fp32, as Megatron-LM would train")
    for field in (*MODEL_FLAGS, "moe_routing_imbalance"):
        if getattr(args, field, None) is not None:
            model_fields[field] = getattr(args, field)
    for field in PARALLEL_FLAGS:
        if getattr(args, field, None) is not None:
            parallel_fields[field] = getattr(args, field)
    precision = args.precision or precision or "bf16"
    dropped = drop_unused_recompute(parallel_fields) if args.megatron_args is not None else []
    if dropped:
        notes.append(f"ignored {len(dropped)} Megatron flag(s) that do not shape the step: {' '.join(dropped)}")
    if model_ref is not None:
        if base is None or (str(model_ref).endswith(".json") and model_fields.get("seq_length") != base.seq_length):
            base = _base_model(model_ref, model_fields.get("seq_length"))
        model = base.replace(**model_fields) if model_fields else base
    else:
        model = build(ModelSpec, {"name": "megatron-args", **model_fields},
                      "model from --megatron-args (add the missing flags to the line, or --model PRESET)")
    if "global_batch_size" not in parallel_fields and default_global_batch_size is not None:
        parallel_fields["global_batch_size"] = default_global_batch_size
    if "global_batch_size" not in parallel_fields:
        raise ConfigError("--global-batch-size is required once any run setting is given (the default run "
                          "needs no flags); add --global-batch-size N")
    parallel = build(ParallelConfig, {**parallel_fields, "precision": precision}, "parallel layout")
    return model, parallel, notes


def _base_model(model_ref, seq_length: int | None) -> ModelSpec:
    """The model --model names; a config.json is read with the length trained, so its sliding-window check
    sees it."""
    if str(model_ref).endswith(".json") and seq_length is not None:
        return load_hf_config(model_ref, seq_length=seq_length)
    return load_model(model_ref)


def model_header(model: ModelSpec, model_ref=None, seq_length: int | None = None) -> list[str]:
    """The lines every command prints above its answer: the model and its training length, and for a
    config.json the assumptions made reading it (config/load/hf_config.py notes)."""
    lines = [f"model {model.name}: seq_length {model.seq_length:,} tokens per sequence"]
    if model_ref is not None and str(model_ref).endswith(".json"):
        lines += [f"{model_ref}: {n}" for n in hf_notes(model_ref, seq_length=seq_length)]
    return lines


def set_torch_threads(threads: int | None) -> None:
    """``--threads``: torch's intra-op thread count on CPU (None leaves torch's default)."""
    if threads is None:
        return
    if threads < 1:
        raise ConfigError(f"`threads >= 1` must hold, but got (threads={threads})")
    # lazy: loads torch (~1.5 s to import), which importing cli.common does not
    import torch

    torch.set_num_threads(threads)


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def human_bytes(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def human_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} us"
