"""Megatron-LM's ``--moe-layer-freq`` list expressions (also ``--window-attn-skip-freq``), read with bounded
time and memory.

Megatron evaluates the text (training/arguments.py ``moe_freq_type`` at d98e8a64ddf3); echo-tune reads the
same expressions -- integer lists, ``*`` by whole numbers and ``+`` -- from the syntax tree, never by eval,
and knows a pattern's length before it builds any list: ``[1]*300000000`` is refused at once when the model
has fewer layers, a 5000-term sum is read without recursion.
"""

from __future__ import annotations

import ast
import functools

from echo_tune.config._checks import require, require_positive
from echo_tune.errors import ConfigError


class _TooLong(ValueError):
    """The pattern would hold more entries than the model has layers."""


def _terms(node: ast.AST) -> list[ast.AST]:
    """The operands of a chain of ``+`` (iteratively: a 5000-term sum is no recursion)."""
    out, stack = [], [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.BinOp) and isinstance(item.op, ast.Add):
            stack += [item.right, item.left]
        else:
            out.append(item)
    return out


def _eval_pattern(node: ast.AST, limit: int, depth: int = 0) -> list[int]:
    """A Megatron ``--moe-layer-freq`` list expression: int lists, ``*`` by ints and ``+`` only. Its length is
    known before any list is built, so a pattern longer than ``limit`` entries is refused without expanding
    it (``[1]*300000000`` takes no time or memory)."""
    if depth > 32:
        raise ValueError("nested too deeply")
    if isinstance(node, ast.Expression):
        node = node.body
    out: list[int] = []
    for term in _terms(node):
        if isinstance(term, ast.List):
            if len(term.elts) > limit - len(out):
                raise _TooLong()
            part = [e.value for e in term.elts if isinstance(e, ast.Constant) and type(e.value) is int]
            if len(part) != len(term.elts):
                raise ValueError("a list of integers only")
        elif isinstance(term, ast.BinOp) and isinstance(term.op, ast.Mult):
            times, body = (term.right, term.left) if isinstance(term.right, ast.Constant) else (term.left, term.right)
            if not (isinstance(times, ast.Constant) and type(times.value) is int and times.value >= 0):
                raise ValueError("a list times a whole number only")
            base = _eval_pattern(body, limit, depth + 1) if times.value else []
            if len(base) * times.value > limit - len(out):
                raise _TooLong()
            part = base * times.value
        else:
            raise ValueError("unsupported expression")
        out += part
    return out


def moe_layer_pattern(freq: int | str, num_layers: int) -> tuple[int, ...]:
    """1 for an MoE layer, 0 for a dense one; Megatron's ``moe_freq_type`` (arguments.py)."""
    # hashable (bool apart: True == 1 as a key): asked per layer mix of every simulated layout
    if isinstance(freq, (int, str)) and not isinstance(freq, bool) and type(num_layers) is int:
        return _cached_pattern(freq, num_layers)
    return _pattern(freq, num_layers)


def skip_freq_pattern(name: str, freq: int | str, num_layers: int, one_means: str) -> tuple[int, ...]:
    """Per layer (0-based), 1 where the variant runs, from a Megatron "skip frequency": an integer N puts the other
    kind at every N-th layer (``--window-attn-skip-freq``, ``--linear-attention-freq``), a list expression (as
    ``moe_layer_pattern`` reads it) gives every layer. ``name``: the field, ``one_means``: what 1 stands for (errors)."""
    if isinstance(freq, int) or str(freq).strip().isdigit():
        every = int(freq)
        require(every > 0, f"`{name} > 0` must hold, but got ({name}={freq})")
        return tuple(0 if (i + 1) % every == 0 else 1 for i in range(num_layers))
    try:
        return moe_layer_pattern(str(freq), num_layers)
    except ConfigError:
        raise ConfigError(f"`{name}` must be an integer or a 0/1 list expression of one entry per layer "
                          f"(1 = {one_means}), but got ({name}={freq!r})") from None


@functools.lru_cache(maxsize=256)
def _cached_pattern(freq: int | str, num_layers: int) -> tuple[int, ...]:
    return _pattern(freq, num_layers)


def _pattern(freq: int | str, num_layers: int) -> tuple[int, ...]:
    if isinstance(freq, int) and not isinstance(freq, bool):
        require_positive("moe_layer_freq", freq)
        return tuple(1 if i % freq == 0 else 0 for i in range(num_layers))
    text = str(freq).strip()
    if len(text) > 64 * max(num_layers, 1) + 64:  # "1," per layer is plenty; more is not a pattern of them
        raise ConfigError(f"`moe_layer_freq` is {len(text):,} characters long, more than a pattern of "
                          f"{num_layers} layers needs; write it as ([0]*k+[1]*m)")
    try:
        value = _eval_pattern(ast.parse(text if text.startswith(("[", "(")) else f"[{text}]", mode="eval"),
                              num_layers)
        pattern = tuple(value)
    except _TooLong:
        raise ConfigError(f"`len(moe_layer_freq pattern) == num_layers` must hold, but the pattern has more than "
                          f"{num_layers} entries (moe_layer_freq={text[:60]!r}); write one 0/1 per layer") from None
    except (RecursionError, MemoryError):  # Python's parser nests a long sum one level per term
        raise ConfigError(f"`moe_layer_freq` is too deeply nested for Python's parser ({len(text):,} characters); "
                          f"write it with repeats, such as ([0]*3+[1]*58)") from None
    except (SyntaxError, ValueError, TypeError):
        pattern = None
    if pattern is None and text.isdigit():
        return moe_layer_pattern(int(text), num_layers)
    if pattern is None or any(v not in (0, 1) for v in pattern):
        raise ConfigError(f"`moe_layer_freq` must be an integer or a list expression of 0/1 such as "
                          f"([0]*3+[1]*58), but got (moe_layer_freq={text[:80]!r})")
    require(len(pattern) == num_layers,
            f"`len(moe_layer_freq pattern) == num_layers` must hold, but got (pattern length={len(pattern)}, "
            f"num_layers={num_layers}); write one 0/1 per layer")
    return pattern
