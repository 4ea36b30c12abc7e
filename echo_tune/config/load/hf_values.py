"""Typed reading of a Hugging Face ``config.json``: every problem of the file is collected, none truncated.

``int(1024.9)`` is 1024 and ``int("4096")`` is 4096, so a plain ``int()`` turns a wrong value into a silently
different model. ``HFValues`` reads each key as what its transformers configuration class declares (an
integer, a number, a mapping) and records a one-line problem instead: a string, null, a list, a bool, NaN or
infinity, or a non-integral float where an integer is meant. The caller raises them all at once
(``errors.raise_problems``), so a file with three bad keys is fixed in one run.
"""

from __future__ import annotations

import math

from echo_tune.errors import ConfigError

_REQUIRED = object()


class HFValues(dict):
    """A parsed config.json whose ``integer`` / ``number`` readers collect problems in ``problems``."""

    def __init__(self, data: dict, model_type: str):
        super().__init__(data)
        self.model_type = model_type
        self.problems: list[ConfigError] = []

    def _problem(self, key: str, what: str, value) -> None:
        self.problems.append(ConfigError(f"config.json key {key!r} must be {what}, but got ({key}={value!r}); "
                                         f"fix the value in the file"))

    def integer(self, key: str, default=_REQUIRED, *, where: dict | None = None, name: str | None = None):
        """The whole number at ``key`` (an integral float such as 4096.0 is read as 4096); ``default`` when the
        key is absent or null (a required key, absent or null, is a problem)."""
        source = self if where is None else where
        name = name or key
        value = source.get(key)
        if value is None:
            if default is _REQUIRED:
                self.problems.append(ConfigError(
                    f"config.json of model_type {self.model_type!r} must set {name!r} to an integer, but "
                    f"{'it is null' if key in source else 'it is missing'}; the file looks incomplete"))
                return 1
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value != int(value):
            self._problem(name, "a whole number", value)
            return 1 if default is _REQUIRED or default is None else default
        return int(value)

    def number(self, key: str, default: float, *, where: dict | None = None, name: str | None = None) -> float:
        """The finite number at ``key`` (of ``where``, a nested mapping named ``name``), ``default`` when absent
        or null."""
        value = (self if where is None else where).get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self._problem(name or key, "a finite number", value)
            return default
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        """The true/false at ``key`` (``default`` when absent or null)."""
        value = self.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            self._problem(key, "true or false", value)
            return default
        return value

    def mapping(self, key: str) -> dict:
        """The mapping at ``key`` ({} when absent or null)."""
        value = self.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self._problem(key, "a mapping or null", value)
            return {}
        return value
