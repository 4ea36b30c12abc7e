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
