"""The MoE layer's collectives as recording autograd Functions: the all-to-all over EP, the all-gather and
reduce-scatter over the expert groups, and the rows a collective receives (empty when tracing, real data when
``emulate`` or in-place ``profile`` runs the layer through an active object, ``emulate/moe.py``)."""

from __future__ import annotations

import torch
from torch.autograd import Function

from echo_tune.workload.recording.context import active_hook, record_collective


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def received(x: torch.Tensor, rows: int) -> torch.Tensor:
    """A collective's output of ``rows`` rows shaped like ``x``'s: left empty when tracing (the tracer records
    the collective, not its data); an active object that runs the layer for real (``emulate``, in-place
    ``profile``: ``emulate/moe.py``) gives a buffer holding data, as the other ranks would have sent it."""
    receive = active_hook("receive")
    return receive(x, (rows, *x.shape[1:])) if receive is not None else x.new_empty((rows, *x.shape[1:]))


def token_rows(index: torch.Tensor, source_rows: int) -> torch.Tensor:
    """Which of ``source_rows`` token rows each routed copy reads and is summed back into. Tracing keeps
    ``index`` (meta tensors hold no values, only the shape matters); a real run gets the rows a balanced
    router would pick from the active object (``spread_rows``, ``emulate/moe.py``), the routing ``simulate``
    assumes, instead of the router's expert ids."""
    spread = active_hook("spread_rows")
    return spread(index, source_rows) if spread is not None else index


class AllToAll(Function):
    """All-to-all over ``group`` forward and backward; with imbalance the busiest rank receives more than
    it sends, so the size is the larger of its send and receive buffers (no record for one rank)."""

    @staticmethod
    def forward(ctx, x, group, size, out_rows):
        ctx.group, ctx.size, ctx.rows = group, size, x.shape[0]
        ctx.nbytes = max(x.shape[0], out_rows) * nbytes(x[:1])  # the larger of send and receive
        record_collective("all_to_all", group, ctx.nbytes, size)
        return received(x, out_rows)

    @staticmethod
    def backward(ctx, grad):
        record_collective("all_to_all", ctx.group, ctx.nbytes, ctx.size)
        return received(grad, ctx.rows), None, None, None


class Gather(Function):
    """All-gather over ``group`` forward, reduce-scatter backward (Megatron's
    ``gather_from_sequence_parallel_region`` on the expert groups)."""

    @staticmethod
    def forward(ctx, x, group, size):
        ctx.group, ctx.size = group, size
        out = received(x, x.shape[0] * size)
        record_collective("all_gather", group, nbytes(out), size)
        return out

    @staticmethod
    def backward(ctx, grad):
        record_collective("reduce_scatter", ctx.group, nbytes(grad), ctx.size)
        return received(grad, grad.shape[0] // ctx.size), None, None


class Scatter(Function):
    """Reduce-scatter over ``group`` forward, all-gather backward."""

    @staticmethod
    def forward(ctx, x, group, size):
        ctx.group, ctx.size = group, size
        record_collective("reduce_scatter", group, nbytes(x), size)
        return received(x, x.shape[0] // size)

    @staticmethod
    def backward(ctx, grad):
        out = received(grad, grad.shape[0] * ctx.size)
        record_collective("all_gather", ctx.group, nbytes(out), ctx.size)
        return out, None, None


def gather(x, group: str, size: int):
    return Gather.apply(x, group, size) if size > 1 else x


def scatter(x, group: str, size: int):
    return Scatter.apply(x, group, size) if size > 1 else x
