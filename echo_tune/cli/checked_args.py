"""Every numeric CLI flag goes through ``echo_tune.limits.check_number`` (issue 10, one validation layer).

``guard_numeric_flags`` walks a built parser and wraps the ``type`` of each int or float argument, so a
NaN, an infinity or an out-of-range value is an argparse usage error: one line, exit 2, naming the
flag, the value, the rule and the fix. The limit is looked up by the argument's destination name in
``echo_tune.limits.LIMITS``; a float without an entry there must still be finite.
"""

from __future__ import annotations

import argparse

from echo_tune.errors import ConfigError
from echo_tune.limits import check_number

def _checked(kind, dest: str, flag: str):
    def convert(text: str):
        value = kind(text)  # a ValueError is argparse's own "invalid int value: 'x'"
        try:
            check_number(dest, value, flag=flag)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value
    convert.__name__ = kind.__name__  # argparse names the type in its own messages
    return convert

def guard_numeric_flags(parser: argparse.ArgumentParser) -> None:
    """Wrap every int/float argument of ``parser`` and its subparsers with the range check."""
    for action in parser._actions:  # argparse has no public walk over actions
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                guard_numeric_flags(sub)
        elif action.type in (int, float) and action.option_strings:
            action.type = _checked(action.type, action.dest, action.option_strings[0])
        elif action.type in (int, float):
            action.type = _checked(action.type, action.dest, action.dest)


def currency(text: str) -> str:
    """``--currency``: a short printable label (USD, EUR, €); control characters (terminal escape sequences)
    would reach the terminal raw, so they are refused."""
    if not 1 <= len(text) <= 12 or not text.isprintable() or text != text.strip():
        raise argparse.ArgumentTypeError(
            f"`--currency` must be 1 to 12 printable characters without control characters (e.g. USD, EUR, €), "
            f"but got ({ascii(text)})")
    return text
