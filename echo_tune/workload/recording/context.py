"""The active trace recorder, region tags and explicit collective records.

The layer code (``layers.py``, ``comm.py``) calls ``in_region`` and ``record_collective``; both are
no-ops when nothing is being traced. The recorder lives in a module-level variable, not a
thread-local, because autograd may run backward on a worker thread.

How backward ops get their forward region: ``in_region(name, fn, *args)`` runs ``fn`` with the
recorder's region set to ``name``, then walks the autograd graph back from ``fn``'s outputs and
puts a pre-hook on every node not tagged yet (nodes of earlier regions are tagged already, so the
walk stops there). In backward, each node's pre-hook sets the recorder's region before the node runs,
so every aten op and collective that node dispatches is tagged with the region that created it.

Sub-regions (``in_subregion``) name a part of a region in the same way, forward and backward, without
changing the region itself (so recompute and the per-region activation bytes still see the whole
region): the MoE block tags its router, dispatch, experts, combine and shared expert, so that the cost
layer can tell Transformer Engine linear layers (FP8 under ``--fp8-format``) from the router.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

_ACTIVE: Any = None
"""The recorder in use (a ``recorder.TraceRecorder``), or None."""


@contextmanager
def activate(recorder: Any) -> Iterator[Any]:
    """Make ``recorder`` the target of ``record_collective`` and region tags."""
    global _ACTIVE
    previous, _ACTIVE = _ACTIVE, recorder
    try:
        yield recorder
    finally:
        _ACTIVE = previous


def record_collective(name: str, group: str, size_bytes: int, group_size: int) -> None:
    """Record one collective of ``size_bytes`` (nccl-tests convention) over ``group``.

    Nothing is recorded for a group of one rank (Megatron skips those calls).
    """
    if _ACTIVE is not None and group_size > 1:
        _ACTIVE.add_collective(name, group, int(size_bytes))


def start_collective(name: str, group: str, size_bytes: int, group_size: int) -> Any:
    """Record one collective Megatron launches asynchronously (``async_op=True``) to run beside the compute that
    follows until ``finish_collective``; a recorder without ``start_collective`` records it as
    ``record_collective`` does. Returns the handle ``finish_collective`` takes (None when nothing is to wait)."""
    if _ACTIVE is None or group_size <= 1:
        return None
    start = getattr(_ACTIVE, "start_collective", None)
    if start is None:
        _ACTIVE.add_collective(name, group, int(size_bytes))
        return None
    return start(name, group, int(size_bytes))


def finish_collective(handle: Any) -> None:
    """Wait for a collective ``start_collective`` launched (Megatron's ``handle.wait()``)."""
    if handle is not None and _ACTIVE is not None:
        _ACTIVE.finish_collective(handle)


def active_hook(name: str) -> Callable | None:
    """The active object's method ``name``, or None (nothing active, or an object without it). The MoE
    layer asks for ``receive`` and ``spread_rows`` when it runs for real (``workload/mlp/moe.py``)."""
    return getattr(_ACTIVE, name, None) if _ACTIVE is not None else None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


def _set_region_hook(name: str, subregion: str) -> Callable:
    def hook(_grad_outputs):
        if _ACTIVE is not None:
            _ACTIVE.region = name
            _ACTIVE.subregion = subregion
    return hook


def tag_backward(outputs: Any, name: str, subregion: str = "") -> None:
    """Pre-hook every untagged autograd node reachable from ``outputs`` with region ``name`` (and
    ``subregion``)."""
    if _ACTIVE is None:
        return
    stack = [t.grad_fn for t in _tensors(outputs) if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or node in _ACTIVE.tagged_nodes:
            continue
        _ACTIVE.tagged_nodes.add(node)  # node wrappers are stable objects, hashable by identity
        node.register_prehook(_set_region_hook(name, subregion))
        stack.extend(next_node for next_node, _ in node.next_functions)


def tag_current(outputs: Any) -> None:
    """Tag the untagged autograd nodes reachable from ``outputs`` with the current region and sub-region: a part
    whose nested sub-regions (``in_subregion`` inside ``in_subregion``) start from ``outputs`` keeps what came before
    them as its own."""
    if _ACTIVE is not None:
        tag_backward(outputs, _ACTIVE.region, getattr(_ACTIVE, "subregion", ""))


def in_region(name: str, fn: Callable, *args: Any) -> Any:
    """Run ``fn(*args)`` with forward region ``name`` and tag its backward nodes with it.

    An active object with a ``run_region`` method runs the region itself (``emulate`` checkpoints the
    core-attention region there for selective recompute)."""
    if _ACTIVE is None:
        return fn(*args)
    run_region = getattr(_ACTIVE, "run_region", None)
    if run_region is not None:
        return run_region(name, fn, *args)
    previous, _ACTIVE.region = _ACTIVE.region, name
    previous_sub, _ACTIVE.subregion = getattr(_ACTIVE, "subregion", ""), ""
    try:
        out = fn(*args)
    finally:
        _ACTIVE.region, _ACTIVE.subregion = previous, previous_sub
    tag_backward(out, name)
    return out


def in_subregion(name: str, fn: Callable, *args: Any) -> Any:
    """Run ``fn(*args)`` as sub-region ``name`` of the current region, forward and backward.

    Call the parts of a region in forward order, each through this function: the backward walk stops at
    nodes tagged by an earlier part, so each part tags only its own nodes. An active object with a
    ``run_subregion`` method runs the sub-region itself (``emulate`` times the routed experts there)."""
    if _ACTIVE is None:
        return fn(*args)
    run_subregion = getattr(_ACTIVE, "run_subregion", None)
    if run_subregion is not None:
        return run_subregion(name, fn, *args)
    previous, _ACTIVE.subregion = getattr(_ACTIVE, "subregion", ""), name
    try:
        out = fn(*args)
    finally:
        _ACTIVE.subregion = previous
    tag_backward(out, _ACTIVE.region, name)
    return out
