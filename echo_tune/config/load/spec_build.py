"""A frozen spec from a mapping (a YAML file, a preset, a config.json's fields), or one-line errors: unknown
keys, wrong types, out-of-range numbers and unmodelled Megatron settings refused by name, every bad key at once.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from echo_tune.config.flags.unmodelled import refuse_unmodelled_keys
from echo_tune.errors import ConfigError, raise_problems
from echo_tune.io import read_text
from echo_tune.limits import LIMITS, check_number
from echo_tune.safe_yaml import load_yaml


def read_yaml(path: Path, what: str) -> dict:
    """Read a YAML mapping, or raise a one-line ConfigError that says what is wrong with the file."""
    if not path.is_file():
        raise ConfigError(f"{what} file {str(path)!r} does not exist; give a preset name or an existing YAML path")
    try:
        data = load_yaml(read_text(path, f"{what} file"), f"{what} file {str(path)!r}")  # bounded: safe_yaml
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what} file {str(path)!r} is not valid YAML{where}: "
                          f"{getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{what} file {str(path)!r} must hold a YAML mapping of keys to values, "
                          f"but got {type(data).__name__}")
    return data


def check_keys(data: dict, allowed: tuple[str, ...] | list[str], what: str) -> None:
    unknown = sorted(set(map(str, data)) - set(allowed))
    if unknown:
        raise ConfigError(f"unknown {what} key(s) {unknown}; allowed keys are {sorted(allowed)}")


_SCALARS = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}


def check_type(name: str, value: Any, annotation: str, what: str) -> None:
    """Reject a value whose type the field's annotation does not allow (e.g. ``swiglu: "yes"``)."""
    options = [part.strip() for part in str(annotation).split("|")]
    if value is None and "None" in options:
        return
    kinds = [k for k in options if k in _SCALARS]
    if not kinds:
        return  # nested specs, paths and mappings are checked where they are built
    ok = any(isinstance(value, _SCALARS[k]) and not (k != "bool" and isinstance(value, bool)) for k in kinds)
    if not ok:
        wanted = " or ".join({"int": "an integer", "float": "a number", "bool": "true or false",
                              "str": "text"}[k] for k in kinds)
        fix = f'; quote it: {name}: "{value}"' if kinds == ["str"] and isinstance(value, (int, float)) else ""
        raise ConfigError(f"{what} key {name!r} must be {wanted}, but got ({name}={value!r}){fix}")


def build(cls: type, data: dict[str, Any], what: str):
    """Construct a frozen spec from a mapping, turning type errors into one-line ConfigErrors."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    refuse_unmodelled_keys(data, fields, what)
    problems: list[ConfigError] = []  # every bad key of the mapping at once, one line each (issue 21)
    try:
        check_keys(data, list(fields), what)
    except ConfigError as exc:
        problems.append(exc)
    for name, value in data.items():
        if name not in fields:
            continue
        try:
            check_type(name, value, fields[name].type, what)
            if name in LIMITS and value is not None and not isinstance(value, bool) \
                    and isinstance(value, (int, float)):
                check_number(name, value)  # the generous ranges of echo_tune.limits, for files as for flags
        except ConfigError as exc:
            problems.append(exc if str(exc).startswith(what) else ConfigError(f"{what}: {exc}"))
    missing = sorted(n for n, f in fields.items() if n not in data and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    if missing:
        problems.append(ConfigError(f"{what} is missing required key(s) {missing}"))
    raise_problems(problems, what)
    try:
        return cls(**data)
    except TypeError as exc:
        raise ConfigError(f"bad {what}: {exc}") from None
