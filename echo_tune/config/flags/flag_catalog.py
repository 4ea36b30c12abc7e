"""The Megatron-LM flags echo-tune knows: the generated list of every flag, and how argparse spells them.

``config/data/megatron_flags.json`` is written by ``python -m echo_tune.config.flags.flag_catalog_build`` from
NVIDIA/Megatron-LM megatron/training/arguments.py (and the dataclasses it turns into flags) at commit
d98e8a64ddf3. Megatron's parser has ``allow_abbrev=False``, so a flag is one of those exact option strings;
echo-tune also reads ``_`` for ``-`` (``--seq_length``), as a fallback after the exact spelling.
"""

from __future__ import annotations

import difflib
import json
from functools import lru_cache
from pathlib import Path

CATALOG = Path(__file__).parent.parent / "data" / "megatron_flags.json"


@lru_cache(maxsize=None)
def catalog() -> dict:
    return json.loads(CATALOG.read_text())


def megatron_commit() -> str:
    """The short commit the flag list was read at (d98e8a64ddf3)."""
    return catalog()["commit"][:12]


def megatron_flags() -> dict[str, dict]:
    """Option string -> {dest, takes_value, action?, nargs?, choices?, aliases?, deprecated?, origin}."""
    return catalog()["flags"]


def spelling(flag: str, known=()) -> str:
    """The spelling to look ``flag`` up by: itself when Megatron (or ``known``) has it exactly, else with
    ``_`` read as ``-`` (``--seq_length`` -> ``--seq-length``; ``--use-checkpoint-opt_param-scheduler``
    stays as it is, an exact Megatron option string)."""
    if not flag.startswith("--") or flag in megatron_flags() or flag in known:
        return flag
    return "--" + flag[2:].replace("_", "-")


def closest(flag: str, extra=()) -> str | None:
    """The real flag nearest to a misspelt one (difflib), or None when none is near."""
    match = difflib.get_close_matches(flag, [*megatron_flags(), *extra], n=1, cutoff=0.8)
    return match[0] if match else None


def unknown_flag_message(flag: str, extra=()) -> str:
    near = closest(flag, extra)
    hint = f" (did you mean `{near}`?)" if near else ""
    return f"`{flag}` is not a Megatron-LM flag at {megatron_commit()}; remove it or check its spelling{hint}"
