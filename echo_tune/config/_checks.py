"""Small validators that raise one-line ConfigErrors in echo-tune's message style."""

from __future__ import annotations

import math
from collections.abc import Iterable

from echo_tune.errors import ConfigError


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def require_positive(name: str, value: object) -> None:
    # NaN compares False with everything, so `value <= 0` alone would let it through
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"`{name} > 0` must hold, but got ({name}={value!r})")


def require_choice(name: str, value: object, choices: Iterable[object]) -> None:
    choices = tuple(choices)
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ConfigError(f"`{name}` must be one of {allowed}, but got ({name}={value!r})")
