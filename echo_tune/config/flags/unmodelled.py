"""Megatron-LM flags echo-tune does not model, classified so that nothing is dropped silently.

Every flag of Megatron-LM at d98e8a64ddf3 (config/data/megatron_flags.json, see config/flags/flag_catalog.py) is
exactly one of: modelled (config/launch/megatron_args.py's tables), or one of the classes of
config/data/megatron_flag_classes.yaml, each flag there with its reason:

- ``HARMLESS``: does not change a step's compute, memory or communication (checkpointing, logging, data
  paths, schedules, seeds, numeric constants, inference- and RL-only settings). Ignored with a note.
- ``STEP_SHAPING``: changes compute, memory or communication in ways echo-tune does not model. A launch
  line, rank candidate, runs-CSV row or YAML model/layout that sets one is refused by name.
- ``OUT_OF_SCOPE``: turns the run into something other than a GPT/MoE pre-training step (RL, knowledge
  distillation, SFT). Refused by name.
- ``VALUE_RULES``: the listed values are modelled (Megatron's defaults); any other value is refused.

A flag Megatron-LM does not define (and no kept legacy spelling) is refused as not a Megatron-LM flag.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from echo_tune.config.flags.flag_catalog import megatron_flags, spelling, unknown_flag_message
from echo_tune.config.launch.megatron_flag_tables import ALIASES, LINE_FLAGS, MEGATRON_FLAGS, SPECIAL_FLAGS
from echo_tune.errors import ConfigError

CLASSES = Path(__file__).parent.parent / "data" / "megatron_flag_classes.yaml"


class UnmodelledError(ConfigError):
    """A setting that shapes the step but is not modelled (or is unknown): refused, never ignored."""


def _groups(section: dict) -> dict[str, frozenset[str]]:
    return {reason: frozenset(str(text).split()) for reason, text in section.items()}


_DATA = yaml.safe_load(CLASSES.read_text())
HARMLESS = _groups(_DATA["harmless"])
"""Ignored with a note, by reason."""
STEP_SHAPING = _groups(_DATA["step_shaping"])
"""Refused by name, by reason (the group "being modelled (merge will move these)" is modelled elsewhere)."""
OUT_OF_SCOPE = _groups(_DATA["out_of_scope"])
"""Refused by name: what the flag turns the run into."""
VALUE_RULES = {flag: tuple(str(v) for v in rule["models"]) for flag, rule in _DATA["value_rules"].items()}
"""Flag -> the values echo-tune models (Megatron's defaults); any other value is refused."""
VALUE_RULE_REASONS = {flag: rule["why"] for flag, rule in _DATA["value_rules"].items()}
LEGACY = dict(_DATA["legacy"])
"""Spellings Megatron-LM d98e8a64ddf3 no longer defines that echo-tune still reads, with why."""

_HARMLESS = {flag: reason for reason, flags in HARMLESS.items() for flag in flags}
_STEP_SHAPING = {flag: reason for reason, flags in STEP_SHAPING.items() for flag in flags}
_OUT_OF_SCOPE = {flag: reason for reason, flags in OUT_OF_SCOPE.items() for flag in flags}
STEP_SHAPING_FLAGS = frozenset(_STEP_SHAPING) | frozenset(_OUT_OF_SCOPE) | frozenset(VALUE_RULES)


def modelled_flags() -> frozenset[str]:
    """Flags config/launch/megatron_args.py reads into a spec field (config/launch/megatron_flag_tables.py: the tables and
    special cases)."""
    return MEGATRON_FLAGS | frozenset(LINE_FLAGS) | frozenset(ALIASES) | frozenset(SPECIAL_FLAGS)


def classes_of(flag: str) -> list[tuple[str, str]]:
    """Every (class, reason) ``flag`` is listed in; exactly one for a classified flag."""
    found = [("modelled", "config/launch/megatron_args.py")] if flag in modelled_flags() else []
    for name, table in (("harmless", _HARMLESS), ("step_shaping", _STEP_SHAPING), ("out_of_scope", _OUT_OF_SCOPE),
                        ("value_rule", VALUE_RULE_REASONS)):
        if flag in table:
            found.append((name, table[flag]))
    return found


def unclassified(flags) -> list[str]:
    """The flags of ``flags`` that are in no class, or in more than one."""
    return [flag for flag in flags if len(classes_of(flag)) != 1]


def refusal(flag: str, values: tuple[str, ...] = ()) -> str | None:
    """Why ``flag`` (with its values) is refused, or None when it is harmless."""
    flag = spelling(flag, {*_HARMLESS, *_STEP_SHAPING, *_OUT_OF_SCOPE, *VALUE_RULES, *LEGACY})
    if flag in _STEP_SHAPING:
        return (f"`{flag}` shapes the step ({_STEP_SHAPING[flag]}) but is not modelled by echo-tune; "
                f"remove it to simulate without it")
    if flag in _OUT_OF_SCOPE:
        return (f"`{flag}` means {_OUT_OF_SCOPE[flag]}, which is out of scope for echo-tune (it simulates "
                f"GPT/MoE pre-training steps); remove it")
    if flag in VALUE_RULES:
        allowed = VALUE_RULES[flag]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            return (f"`{flag} {' '.join(values)}` is not modelled ({VALUE_RULE_REASONS[flag]}; echo-tune "
                    f"models {flag} {' / '.join(allowed)} only); remove it or use that value")
        return None
    if flag in _HARMLESS:
        return None
    if flag in megatron_flags() or flag in LEGACY:
        if flag in modelled_flags():
            return None
        return (f"`{flag}` is a Megatron-LM flag that echo-tune has not classified "
                f"(config/data/megatron_flag_classes.yaml), so it cannot tell whether it shapes the step; remove it")
    return unknown_flag_message(flag, LEGACY)


def harmless_reason(flag: str) -> str | None:
    return _HARMLESS.get(flag)


def refuse_if_unmodelled(flag: str, values: tuple[str, ...] = ()) -> None:
    reason = refusal(flag, values)
    if reason is not None:
        raise UnmodelledError(reason)


def refuse_unmodelled_keys(keys, known, what: str) -> None:
    """A YAML / CSV key named after a step-shaping Megatron setting that echo-tune does not model is
    refused by name (other unknown keys are left to the caller's unknown-key error)."""
    for key in keys:
        flag = "--" + str(key).replace("_", "-")
        if key not in known and flag in STEP_SHAPING_FLAGS:
            raise UnmodelledError(f"{what}: key {key!r} ({flag}) shapes the step but is not modelled by "
                                  f"echo-tune; remove it")
