"""Split a pasted Megatron-LM launch line into (flag, values) as Megatron-LM's argparse would.

Megatron-LM d98e8a64ddf3 builds its parser with ``argparse.ArgumentParser(allow_abbrev=False)``
(megatron/training/arguments.py, ``parse_args``), so on a launch line:

- a flag is an exact ``--`` option string; ``--flag=value`` is the same as ``--flag value``;
- a ``store_true`` / ``store_false`` flag takes no value: ``--sequence-parallel=false`` is refused
  ("ignored explicit argument") and ``--swiglu false`` leaves ``false`` as an unrecognized argument;
- a flag that takes one value takes the next token (argparse refuses a following ``--flag`` as its value);
  ``nargs="+"`` / ``"*"`` take every token up to the next flag;
- a token that is neither (``-tp 2``; ``—tensor-model-parallel-size 2`` written with a typographic dash)
  is an unrecognized argument: refused, never dropped.

Tokens before the first flag are the program (``VAR=value``, ``pretrain_gpt.py``); a launcher's own flags
(``torchrun --nproc_per_node 8 --nnodes 2 ... pretrain_gpt.py``) run up to the script path (``program_end``). Every
problem of the line is collected, so one run reports all of them (``errors.Problems``).
"""

from __future__ import annotations

import re
import shlex

from echo_tune.config.flags.flag_catalog import megatron_flags, spelling

_MAX_NUMBER_CHARS = 100  # as safe_yaml.MAX_NUMBER_CHARS: no quantity echo-tune reads needs more than 20 digits
_NUMBER = re.compile(r"^-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
# dashes a word processor or chat client puts where `--` was typed (U+2012..U+2015, U+2212 minus)
_TYPOGRAPHIC = "\u2012\u2013\u2014\u2015\u2212"
# programs that take their own flags before the training script (torch.distributed's launcher, Python itself,
# DeepSpeed's and Accelerate's launchers, Slurm / MPI / Nsight wrappers)
_LAUNCHER = re.compile(r"^(torchrun|python[0-9.]*|deepspeed|accelerate|srun|mpirun|mpiexec|nsys|numactl|uv)$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# short spellings users write for Megatron's long flags (Megatron-LM defines none of them)
_SHORT = {"-tp": "--tensor-model-parallel-size", "-pp": "--pipeline-model-parallel-size",
          "-cp": "--context-parallel-size", "-ep": "--expert-model-parallel-size",
          "-etp": "--expert-tensor-parallel-size", "-vpp": "--num-virtual-stages-per-pipeline-rank",
          "-mbs": "--micro-batch-size", "-gbs": "--global-batch-size", "-sp": "--sequence-parallel"}


def _is_flag(token: str) -> bool:
    # token[:1] of an empty token ('' quoted on the line) is "", which `in` finds in any string: not a flag
    return token.startswith("--") or (token != "" and token[:1] in _TYPOGRAPHIC) or (token.startswith("-") and len(token) > 1
                                                                  and not _NUMBER.match(token))


def program_end(tokens: list[str]) -> int:
    """Index of the first token after the program: ``VAR=value`` assignments, then either a launcher
    (``torchrun --nproc_per_node 8 --nnodes 2 ... pretrain_gpt.py``, ``python -u pretrain_gpt.py``) whose own
    flags run up to and including the script path (or the module after ``-m``), or plain words up to the first
    flag."""
    i = 0
    while i < len(tokens) and _ENV.match(tokens[i]):
        i += 1
    if i < len(tokens) and _LAUNCHER.match(tokens[i].rsplit("/", 1)[-1]):
        for j in range(i + 1, len(tokens)):
            if tokens[j].endswith(".py") and not tokens[j].startswith("-"):
                return j + 1  # the script: the launcher's flags are its own, not Megatron-LM's
        modules = [j for j in range(i + 1, len(tokens) - 1) if tokens[j] in ("-m", "--module")
                   and not _is_flag(tokens[j + 1])]
        if modules:  # `torchrun ... -m megatron.training.pretrain_gpt` / `python -m pkg.train`: the module
            return modules[-1] + 2
    while i < len(tokens) and not _is_flag(tokens[i]):
        i += 1
    return i


def _values_ahead(tokens: list[str], i: int, n) -> list[str]:
    """The tokens from ``i`` that a flag of arity ``n`` would take (up to the next flag)."""
    want = n if isinstance(n, int) else -1
    out: list[str] = []
    while i < len(tokens) and (want < 0 or len(out) < want) and not _is_flag(tokens[i]):
        out.append(tokens[i])
        i += 1
    return out


def arity(flag: str, kinds: dict[str, int | str]) -> int | str | None:
    """Values ``flag`` takes: 0, 1, "+" or "*"; None for a flag Megatron-LM does not define."""
    if flag in kinds:
        return kinds[flag]
    info = megatron_flags().get(flag)
    if info is None and flag.startswith("--no-"):  # argparse.BooleanOptionalAction's negative spelling
        info = megatron_flags().get("--" + flag[5:])
        if info is not None and info.get("action") != "BooleanOptionalAction":
            info = None
    if info is None:
        return None
    if not info.get("takes_value"):
        return 0
    nargs = info.get("nargs")
    return int(nargs) if str(nargs).isdigit() else (nargs or 1)


def split_line(line: str, kinds: dict[str, int | str], problems: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(flag, values) of each flag of ``line``; every problem is appended to ``problems`` (one line each)."""
    try:
        tokens = shlex.split(line.replace("\\\n", " "))
    except ValueError as exc:
        problems.append(f"--megatron-args is not a valid shell line: {exc}")
        return []
    i = program_end(tokens)
    if i >= len(tokens):  # read as no flag at all, it would train in fp32 with Megatron's defaults: a slip, refused
        got = "a blank line" if not tokens else "only the program"
        problems.append(f"`the Megatron launch line holds a flag` must hold, but got {got} ({line[:80]!r}); give the "
                        f"line's flags (e.g. --megatron-args \"--tensor-model-parallel-size 8 --bf16 ...\"), or leave "
                        f"--megatron-args out")
        return []
    out: list[tuple[str, tuple[str, ...]]] = []
    previous = None
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if not _is_flag(token):
            after = f"`{previous}` takes no value" if previous and arity(previous, kinds) == 0 else \
                f"it follows `{previous}`, which takes no more values"
            problems.append(f"`{token}` is not a flag nor the value of one ({after}); Megatron-LM's argparse refuses "
                            f"it as an unrecognized argument; remove it")
            continue
        flag, eq, inline = token.partition("=")
        if not token.startswith("--"):
            while i < len(tokens) and not _is_flag(tokens[i]):
                i += 1  # its values go with it
            if token[:1] in _TYPOGRAPHIC:
                fixed = "--" + flag.lstrip(_TYPOGRAPHIC + "-")
                problems.append(f"`{flag}` starts with a typographic dash (U+{ord(token[0]):04X}), not `--`, so "
                                f"Megatron-LM would not read it; retype it as `{fixed}`")
            else:
                hint = f"; write `{_SHORT[flag]}`" if flag in _SHORT else ""
                problems.append(f"`{flag}` is not a Megatron-LM flag (Megatron-LM defines long `--` flags only, "
                                f"parsed with allow_abbrev=False){hint}")
            continue
        flag = spelling(flag, kinds)
        previous = flag
        n = arity(flag, kinds)
        ahead = [] if eq else _values_ahead(tokens, i, n)
        long = [v for v in ([inline] if eq else ahead) if len(v) > _MAX_NUMBER_CHARS and _NUMBER.match(v)]
        if long:  # Python refuses to read an integer of more than 4,300 digits, with a traceback
            problems.append(f"`characters of a number <= {_MAX_NUMBER_CHARS}` must hold for the value of `{flag}`, but "
                            f"got a number of {len(long[0]):,} characters ({long[0][:20]}...); give the value in "
                            f"fewer digits")
            i += len(ahead)
            continue
        if eq:
            if n == 0:
                problems.append(f"`{flag}` takes no value, but got `{token}` (Megatron-LM's argparse refuses it: "
                                f"ignored explicit argument); write `{flag}` to set it, or leave it out")
                continue
            out.append((flag, (inline,)))
            continue
        values: list[str] = []
        want = n if isinstance(n, int) else -1  # "+", "*" and an unknown flag: up to the next flag
        while i < len(tokens) and (want < 0 or len(values) < want) and not _is_flag(tokens[i]):
            values.append(tokens[i])
            i += 1
        if (n == "+" and not values) or (isinstance(n, int) and len(values) < n):
            problems.append(f"`{flag}` needs {'a value' if n in (1, '+') else f'{n} values'}, but "
                            f"{'the line ends after it' if i >= len(tokens) else f'`{tokens[i]}` follows it'}")
            continue
        out.append((flag, tuple(values)))
    return out
