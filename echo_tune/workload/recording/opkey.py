"""The identity of one traced op instance: what a measured op time is stored under.

``op_key(func, args, kwargs)`` is a compact JSON text ``[op, args, kwargs]`` naming the aten (or
``echo_tune::``) overload and every argument: tensors as ``{"t": shape, "s": strides, "d": dtype}``,
dtypes, layouts and memory formats by name, devices as ``"@device"`` (the key never names a device:
the op-time database keeps the device beside the key), scalars and lists as they are. The same op on
the same shapes, strides and dtypes has the same key on ``meta`` and on a real device, so the tracer
can stamp it on each ``Op`` and ``echo_tune.optime`` can rebuild the call with real tensors
(``parse_key``). New layer kinds (MoE, FP8) need nothing here: any op they dispatch gets a key.
"""

from __future__ import annotations

import json
from typing import Any

import torch

_ENUMS = (torch.dtype, torch.layout, torch.memory_format)


def _strides(t: torch.Tensor) -> list[int]:
    """The tensor's strides, with those of size-1 dimensions (which never move in memory) set to 0:
    ``contiguous()`` keeps whatever stride such a dimension had, so the same layout can show several."""
    return [0 if n == 1 else s for n, s in zip(t.shape, t.stride())]


def _encode(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return {"t": list(value.shape), "s": _strides(value), "d": str(value.dtype).removeprefix("torch.")}
    if isinstance(value, _ENUMS):
        return {"e": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return "@device"
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, torch.SymInt):  # pragma: no cover - shapes are concrete when tracing
        return int(value)
    return {"r": type(value).__name__}  # generators and other opaque values: rebuilt as None


def op_key(func, args: tuple, kwargs: dict) -> str:
    """The key of one dispatched call (see the module docstring)."""
    return json.dumps([str(func), _encode(list(args)), {k: _encode(v) for k, v in sorted(kwargs.items())}],
                      separators=(",", ":"))


def parse_key(key: str) -> tuple[str, list, dict]:
    """(op name, encoded args, encoded kwargs) of a key."""
    name, args, kwargs = json.loads(key)
    return name, args, kwargs


def resolve_op(name: str):
    """``aten.mm.default`` -> ``torch.ops.aten.mm.default``."""
    namespace, packet, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload)


def key_summary(key: str) -> tuple[str, str, str]:
    """(op, shapes, dtypes) of a key, for the database's readable columns."""
    name, args, kwargs = parse_key(key)
    tensors: list[dict] = []

    def walk(value):
        if isinstance(value, dict) and "t" in value:
            tensors.append(value)
        elif isinstance(value, list):
            for v in value:
                walk(v)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)

    walk([args, kwargs])
    shapes = ";".join("x".join(map(str, t["t"])) or "scalar" for t in tensors)
    dtypes = ";".join(dict.fromkeys(t["d"] for t in tensors))
    return name, shapes, dtypes


def materialize(encoded: Any, device: torch.device, generator: torch.Generator | None = None) -> Any:
    """Rebuild an encoded argument with real tensors on ``device``.

    Floating tensors are standard normal (``generator`` must live on ``device``); integer and boolean
    tensors are zero (a valid index for every gather, embedding and scatter; a mask that masks nothing).
    Strided layouts are kept.
    """
    if isinstance(encoded, list):
        return [materialize(v, device, generator) for v in encoded]
    if isinstance(encoded, dict):
        if "t" in encoded:
            dtype = getattr(torch, encoded["d"])
            shape, strides = encoded["t"], encoded["s"]
            size = 1 + sum((n - 1) * st for n, st in zip(shape, strides)) if all(shape) else 0
            if dtype.is_floating_point:
                flat = torch.randn(size, dtype=torch.float32, device=device, generator=generator).to(dtype)
            else:
                flat = torch.zeros(size, dtype=dtype, device=device)
            out = torch.as_strided(flat, shape, strides)
            return out
        if "e" in encoded:
            return getattr(torch, encoded["e"])
        if "r" in encoded:
            return None
        return {k: materialize(v, device, generator) for k, v in encoded.items()}
    if encoded == "@device":
        return device
    return encoded
