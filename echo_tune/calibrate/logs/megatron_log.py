"""Read a Megatron-LM training log into measured runs: each argument dump and the iteration times after it.

Shapes (Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553):
- ``megatron/training/arguments.py`` ``_print_args("arguments", args)`` prints, on rank 0,
  ``------------------------ arguments ------------------------``, then one line per argument (every one,
  set or not), ``'  {} {} {}'.format(arg, '.' * (48 - len(arg)), value)``, then
  ``-------------------- end of arguments ---------------------``. How its values are read: megatron_dump.py.
- ``megatron/training/training.py`` ``training_log`` prints, every ``--log-interval`` iterations,
  `` [date] iteration {:8d}/{:8d} | consumed samples: {:12d} | elapsed time per iteration (ms): {:.1f} | ...
  | number of skipped iterations: {:3d} | number of nan iterations: {:3d} |``.
- torchrun ``--tee`` / ``--log-dir`` prefixes each line with ``[default0]:``; ``srun --label`` with ``0: ``.

A file may hold several runs (a job relaunched into the same file): each argument dump starts one, and the
iteration lines after it are its own. The step time of a run is the median over its logged intervals after
the first (which carries start-up: compilation, allocator warm-up, NCCL set-up), leaving out intervals with
skipped iterations (an fp16 overflow skips the optimizer step: a shorter iteration). Whatever cannot be read is
refused in one line naming the file and the line.
"""

from __future__ import annotations

import hashlib
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.calibrate.logs import megatron_dump
from echo_tune.errors import ConfigError
from echo_tune.io import os_error_message
from echo_tune.validate.runs import MODEL_FIELDS, PARALLEL_FIELDS, case_from_row

ARGS_BEGIN = re.compile(r"^-+ arguments -+\s*$")
ARGS_END = re.compile(r"^-+ end of arguments -+\s*$")
# "[default0]:" (torchrun --tee), "[rank0]:" (torch's own messages), "0: " (srun --label); never a "[date]"
RANK_PREFIX = re.compile(r"^(\[(default|rank)\d+\]:|\s*\d+: )")
# '  {} {} {}'.format(arg, '.' * (48 - len(arg)), value): no dots for names of 48 characters or more, and a
# value of '' leaves the line ending in a space (which an editor may strip)
ARG_LINE = re.compile(r"^  (\w+) \.*(?: (.*))?$")
ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\S+) \|")
ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([^|\s]*)")
SKIPPED = re.compile(r"number of skipped iterations: *([^|\s]*)")
NUMBER = re.compile(r"^\d+(\.\d*)?([eE][-+]?\d+)?$")
# megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding, logged after the dump
PADDED_VOCAB = re.compile(r"> padded vocab \(size: (\d+)\) with (\d+) dummy tokens \(new size: (\d+)\)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Iteration:
    iteration: int
    elapsed_ms: float
    skipped: int
    line: int


@dataclass(frozen=True, kw_only=True)
class LoggedRun:
    """One argument dump of a log and the iteration lines that follow it."""

    path: Path
    line: int
    """The line of the dump's ``arguments`` header (1-based)."""
    args: dict[str, str]
    arg_lines: dict[str, int]
    iterations: tuple[Iteration, ...] = ()
    padded_vocab_size: int | None = None
    digest: str = ""
    """SHA-256 of the run's argument and iteration lines: the same run given twice is one run."""
    notes: tuple[str, ...] = field(default_factory=tuple)


def strip_prefix(line: str) -> str:
    return RANK_PREFIX.sub("", line.rstrip("\r\n"), count=1)


def _error(path: Path, line: int, message: str) -> ConfigError:
    message = re.sub(r"\s*\n\s*-?\s*", "; ", message)  # one line, whatever the reason's own layout
    return ConfigError(f"Megatron log {str(path)!r} line {line}: {message}")


def _iteration(path: Path, number: int, text: str, match: re.Match) -> Iteration | None:
    elapsed = ELAPSED.search(text)
    if elapsed is None:
        return None
    raw = elapsed.group(1)
    if not NUMBER.match(raw):
        raise _error(path, number, f"`elapsed time per iteration (ms)` must be a number, but got ({raw!r}); the "
                                   f"line is corrupt (interleaved output?): repair or delete it")
    skipped = SKIPPED.search(text)
    count = skipped.group(1) if skipped else "0"
    if not count.isdigit():
        raise _error(path, number, f"`number of skipped iterations` must be a whole number, but got ({count!r}); "
                                   f"repair or delete the line")
    return Iteration(iteration=int(match.group(1)), elapsed_ms=float(raw), skipped=int(count), line=number)


def _lines(path: Path):
    """(number, line without its rank prefix) of a log, read as a stream: a week-long run's log can be GBs."""
    try:
        with open(path, encoding="utf-8", errors="replace", newline=None) as stream:
            for number, raw in enumerate(stream, start=1):
                yield number, strip_prefix(raw)
    except OSError as exc:
        raise ConfigError(os_error_message(exc, "Megatron log")) from None


def parse_log(path: str | Path) -> list[LoggedRun]:
    """Every run of a Megatron-LM log, in order (an empty list when it holds no argument dump)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Megatron log {str(path)!r} does not exist or is not a file; give the stdout of a "
                          f"Megatron-LM run")
    runs: list[dict] = []
    inside, orphans, number = False, 0, 0
    for number, line in _lines(path):
        if ARGS_BEGIN.match(line.strip()):
            if inside:
                raise _error(path, number, f"a second argument dump starts before the one of line {runs[-1]['line']} "
                                           f"ends ('end of arguments'): the log is cut or two ranks' output mixed; "
                                           f"keep one rank's whole output")
            runs.append({"line": number, "args": {}, "arg_lines": {}, "iterations": [], "vocab": None,
                         "digest": hashlib.sha256()})
            inside = True
        elif inside and ARGS_END.match(line.strip()):
            inside = False
        elif inside and (match := ARG_LINE.match(line)):
            runs[-1]["args"][match.group(1)] = (match.group(2) or "").strip()
            runs[-1]["arg_lines"][match.group(1)] = number
            runs[-1]["digest"].update(line.encode() + b"\n")
        elif not inside and (match := ITERATION.search(line)):
            step = _iteration(path, number, line, match)
            if step is None:
                continue
            if not runs:
                orphans += 1
                continue
            previous = runs[-1]["iterations"]
            if previous and step.iteration <= previous[-1].iteration:
                raise _error(path, number, f"iteration {step.iteration} follows iteration {previous[-1].iteration} "
                                           f"(line {previous[-1].line}) without a new argument dump: two runs are "
                                           f"mixed in this file; split it, one run per file, each with its dump")
            previous.append(step)
            runs[-1]["digest"].update(line.encode() + b"\n")
        elif not inside and runs and runs[-1]["vocab"] is None and (match := PADDED_VOCAB.search(line)):
            runs[-1]["vocab"] = int(match.group(3))
    if inside:
        raise _error(path, runs[-1]["line"], f"the argument dump starting here never ends (no 'end of arguments' "
                                             f"line by line {number}): the log is cut; keep rank 0's whole output")
    notes = (f"{path}: {orphans} iteration line(s) before the first argument dump belong to no dump and are left "
             f"out",) if orphans else ()
    return [LoggedRun(path=path, line=run["line"], args=run["args"], arg_lines=run["arg_lines"],
                      iterations=tuple(run["iterations"]), padded_vocab_size=run["vocab"],
                      digest=run["digest"].hexdigest(), notes=notes if i == 0 else ()) for i, run in enumerate(runs)]


def step_time_s(run: LoggedRun, *, skip_first: int = 1) -> float:
    """Median seconds per iteration over the run's logged intervals after the first ``skip_first``, leaving out
    intervals with skipped iterations."""
    kept = [it.elapsed_ms for it in run.iterations[skip_first:] if it.skipped == 0]
    if not kept:
        skipped = sum(1 for it in run.iterations[skip_first:] if it.skipped)
        raise _error(run.path, run.line, f"`iteration lines after the first > 0` must hold for the run whose dump "
                                         f"starts here, but got ({len(run.iterations)} 'elapsed time per iteration "
                                         f"(ms)' lines, {skipped} of them with skipped iterations); train more "
                                         f"iterations or lower --log-interval")
    return statistics.median(kept) / 1000.0


def run_name(run: LoggedRun, runs_in_file: int) -> str:
    return run.path.stem if runs_in_file == 1 else f"{run.path.stem}@line{run.line}"


def row_of(run: LoggedRun, cluster: str, runs_in_file: int = 1, *, skip_first: int = 1) -> dict[str, str]:
    """One runs-CSV row (validate's format) from a logged run: the dump's arguments as Megatron resolves them
    (megatron_dump.py), ``num_gpus`` (world_size) and ``measured_step_time_s``. An argument that sets a
    step-shaping setting echo-tune does not model refuses the run."""
    path, args = run.path, run.args
    if refused := megatron_dump.unmodelled(args):
        name, flag, why = refused[0]
        raise _error(path, run.arg_lines[name], f"the run sets `{name} {args[name]}` ({flag}): {why}, so the run "
                                                f"cannot be fitted; leave this log out")
    if "world_size" not in args:
        raise _error(path, run.line, "the argument dump has no world_size; it is not a Megatron-LM argument dump")
    row = {"name": run_name(run, runs_in_file), "cluster": cluster,
           "source": f"Megatron-LM log {path.name}" + (f" line {run.line}" if runs_in_file > 1 else ""),
           "measured_step_time_s": repr(step_time_s(run, skip_first=skip_first))}
    row |= megatron_dump.columns(args, {**MODEL_FIELDS, **PARALLEL_FIELDS})
    if "vocab_size" not in row:  # --vocab-size unset: the tokenizer's size, padded, is logged after the dump
        if run.padded_vocab_size is None:
            raise _error(path, run.line, "no vocab_size in the argument dump and no ' > padded vocab (size: ...)' "
                                         "line after it; keep rank 0's full output")
        row["vocab_size"] = str(run.padded_vocab_size)
    row["num_gpus"] = args["world_size"]
    return row


def run_row(path: str | Path, cluster: str, *, skip_first: int = 1) -> dict[str, str]:
    """The runs-CSV row of a log that holds one run."""
    runs = parse_log(path)
    if not runs:
        raise ConfigError(f"Megatron log {str(path)!r} has no argument dump ('------------------------ arguments "
                          f"------------------------' ... 'end of arguments'); Megatron-LM prints it on rank 0 at "
                          f"start-up: keep rank 0's output, or give the run as a --runs CSV row")
    if len(runs) > 1:
        raise ConfigError(f"Megatron log {str(path)!r} holds {len(runs)} runs (argument dumps at lines "
                          f"{[r.line for r in runs]}); read it with read_logs, which keeps them apart")
    return row_of(runs[0], cluster, skip_first=skip_first)


def read_logs(paths: list[str | Path], cluster: str, notes: list[str] | None = None):
    """RunCases (validate/runs.py) of every run of the Megatron-LM logs, all on ``cluster``. The same run given
    twice (the same file twice, or the same lines in two files) is read once, with a note in ``notes``."""
    notes = [] if notes is None else notes
    cases, seen = [], {}
    for path in paths:
        runs = parse_log(path)
        if not runs:
            run_row(path, cluster)  # raises the no-dump error
        usable = [run for run in runs if len(run.iterations) > 1]
        for run in runs:
            notes.extend(run.notes)
            if len(runs) > 1 and usable and run not in usable:  # a launch that died before training (OOM, ...)
                notes.append(f"{path} line {run.line}: the run whose dump starts here logged {len(run.iterations)} "
                             f"iteration line(s), none after the first: left out")
                continue
            if run.digest in seen:
                notes.append(f"{path} line {run.line}: the same run as {seen[run.digest]}; counted once")
                continue
            seen[run.digest] = f"{path} line {run.line}"
            row = row_of(run, cluster, len(runs))
            # no errata, and no refusal of omitted architecture columns: the dump states every setting (a column
            # left out of the row is at Megatron's default because the dump printed that default)
            case = case_from_row(row, Path("."), {}, grandfathered=True)
            if case.error:  # the user gave this log to be fitted: say why it cannot be, never skip it quietly
                raise _error(Path(path), run.line, f"the run whose argument dump starts here cannot be simulated: "
                                                   f"{case.error}")
            cases.append(case)
    return cases
