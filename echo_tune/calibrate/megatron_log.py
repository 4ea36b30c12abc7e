"""Read a Megatron-LM training log into a measured run: its argument dump and its iteration times.

Shapes (Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553):
- ``megatron/training/arguments.py`` ``_print_args("arguments", args)`` prints, on rank 0,
  ``------------------------ arguments ------------------------``, then one line per argument,
  ``'  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)``, then
  ``-------------------- end of arguments ---------------------``.
- ``megatron/training/training.py`` ``training_log`` prints, every ``--log-interval`` iterations,
  `` [date] iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} | ...``.

The step time taken is the median over the logged intervals after the first (which carries start-up:
compilation, allocator warm-up, NCCL set-up). NeMo / Megatron-Bridge logs are read as far as they print the
same two shapes; a log without the argument dump is refused by name.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from echo_tune.errors import ConfigError

ARGS_BEGIN = re.compile(r"^-+ arguments -+\s*$")
ARGS_END = re.compile(r"^-+ end of arguments -+\s*$")
RANK_PREFIX = re.compile(r"^(\[[^\]]*\] ?|\d+: )")  # "[default0]:" / "0: " added by torchrun or srun --label
ARG_LINE = re.compile(r"^  (\w+) \.+ ?(.*)$")
ITERATION = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|.*?elapsed time per iteration \(ms\): ([0-9.]+)")
# megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding, logged after the dump
PADDED_VOCAB = re.compile(r"> padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)")
# Megatron argument names whose dump value is a different column here
RENAMED = {"fp8": "fp8_format"}


def parse_arguments(lines: list[str]) -> dict[str, str]:
    """The argument dump as {name: value text} (the value as Python printed it)."""
    args, inside = {}, False
    for line in lines:
        line = RANK_PREFIX.sub("", line.rstrip("\n"))
        if ARGS_BEGIN.match(line.strip()):
            inside, args = True, {}
            continue
        if inside and ARGS_END.match(line.strip()):
            return args
        if inside and (match := ARG_LINE.match(line)):
            args[match.group(1)] = match.group(2).strip()
    return args if inside else {}


def iteration_times_ms(lines: list[str]) -> list[tuple[int, float]]:
    """(iteration, elapsed ms per iteration) of every ``training_log`` line."""
    return [(int(m.group(1)), float(m.group(3))) for line in lines if (m := ITERATION.search(line))]


def _text(value: str) -> str | None:
    """A dump value as a runs-CSV cell; None for Python's None."""
    if value in ("None", ""):
        return None
    if value.startswith("torch."):
        return value[len("torch."):]
    if re.fullmatch(r"[A-Z]\w*\.\w+", value):  # an enum as Python prints it: AttnBackend.auto -> auto
        return value.split(".", 1)[1]
    return value


def run_row(path: str | Path, cluster: str, *, skip_first: int = 1) -> dict[str, str]:
    """One runs-CSV row (validate's format) from a Megatron-LM log: the dumped arguments that are columns,
    ``num_gpus`` (world_size), ``precision`` (bf16 / fp16 flags) and ``measured_step_time_s``."""
    from echo_tune.validate.runs import MODEL_FIELDS, PARALLEL_FIELDS

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Megatron log {str(path)!r} does not exist; give the stdout of a Megatron-LM run")
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    args = parse_arguments(lines)
    if not args:
        raise ConfigError(f"Megatron log {str(path)!r} has no argument dump ('------------------------ arguments "
                          f"------------------------' ... 'end of arguments'); Megatron-LM prints it on rank 0 at "
                          f"start-up: keep rank 0's output, or give the run as a --runs CSV row")
    times = [ms for _, ms in iteration_times_ms(lines)]
    if len(times) <= skip_first:
        raise ConfigError(f"Megatron log {str(path)!r}: `iteration lines > {skip_first}` must hold (the first "
                          f"carries start-up), but got ({len(times)} 'elapsed time per iteration (ms)' lines); "
                          f"train more iterations or lower --log-interval")
    row = {"name": path.stem, "source": f"Megatron-LM log {path.name}", "cluster": cluster,
           "measured_step_time_s": repr(statistics.median(times[skip_first:]) / 1000.0)}
    for name, value in args.items():
        column = RENAMED.get(name, name)
        if column in MODEL_FIELDS or column in PARALLEL_FIELDS:
            text = _text(value)
            if text is not None:
                row[column] = text
    if "vocab_size" not in row:  # --vocab-size unset: the tokenizer's size, padded, is logged after the dump
        padded = [m.group(3) for line in lines if (m := PADDED_VOCAB.search(line))]
        if not padded:
            raise ConfigError(f"Megatron log {str(path)!r}: no vocab_size in the argument dump and no ' > padded vocab "
                              f"(size: ...)' line; keep rank 0's full output")
        row["vocab_size"] = padded[0]
    if "world_size" not in args:
        raise ConfigError(f"Megatron log {str(path)!r}: the argument dump has no world_size; it is not a "
                          f"Megatron-LM argument dump")
    row["num_gpus"] = args["world_size"]
    row["precision"] = "bf16" if args.get("bf16") == "True" else "fp16" if args.get("fp16") == "True" else "fp32"
    return row


def read_logs(paths: list[str | Path], cluster: str):
    """RunCases (validate/runs.py) from Megatron-LM logs, all on ``cluster``."""
    from echo_tune.validate.runs import REQUIRED_COLUMNS, case_from_row

    cases = []
    for path in paths:
        row = run_row(path, cluster)
        missing = [c for c in REQUIRED_COLUMNS if c not in row]
        if missing:
            raise ConfigError(f"Megatron log {str(path)!r}: the argument dump lacks {missing}")
        cases.append(case_from_row(row, Path("."), {}))
    return cases
