"""Errors raised by echo-tune.

Every message is one line that names the rule, the values and the fix, in the style
"`low <= high` must hold, but got (low=3, high=2)". The CLI prints it and exits with code 2.
"""

from __future__ import annotations


class EchoTuneError(Exception):
    """Base class of every error echo-tune raises on purpose."""


class ConfigError(EchoTuneError, ValueError):
    """A model, cluster, layout or file breaks a rule (bad input, not an infeasible config)."""


class CalibrationError(EchoTuneError):
    """Calibration data cannot be read or fitted."""


class InfeasibleConfigError(EchoTuneError):
    """A valid layout that cannot run (e.g. it does not fit in GPU memory)."""


def raise_problems(problems: list[Exception | str], what: str) -> None:
    """Raise every problem of one input at once: a single problem as its own one-line error; several as one
    error whose message is a header line and one line per problem (issue 21). The error's class is the
    problems' common class (an UnmodelledError only when every problem is one), else ConfigError."""
    if not problems:
        return
    errors, seen = [], set()
    for p in problems:  # a value read twice is one problem
        if str(p) not in seen:
            seen.add(str(p))
            errors.append(p if isinstance(p, Exception) else ConfigError(p))
    if len(errors) == 1:
        raise errors[0]
    cls = type(errors[0]) if all(type(e) is type(errors[0]) for e in errors) else ConfigError
    lines = "\n".join(f"  - {e}" for e in errors)
    raise cls(f"{len(errors)} problems in {what}:\n{lines}")
