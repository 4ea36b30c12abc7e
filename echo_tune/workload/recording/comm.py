"""Megatron's tensor-parallel communication as autograd Functions that record their collectives.

On the meta device a collective only has to produce the right shape; what matters is the record
(``context.record_collective``), made from the Function's forward or backward body so that it lands
between the aten ops in execution order. Sizes follow nccl-tests (see ``graph.COLLECTIVES``).

- ``reduce_from_tp``: all_reduce forward, nothing backward (after a row-parallel linear, no SP).
- ``reduce_scatter_to_sp``: reduce_scatter forward, all_gather backward (row-parallel linear, SP).
- ``gather_from_sp``: all_gather forward, reduce_scatter backward (``gather_from_sequence_parallel_region``).
- ``parallel_linear``: Megatron's ``LinearWithGradAccumulationAndAsyncCommunication``. With SP it
  all-gathers its sequence-sharded input forward, saves only the shard, and in backward all-gathers
  it again for the weight gradient and reduce-scatters the input gradient. Without SP, a
  column-parallel linear all-reduces its input gradient (the dual of the identity forward copy).
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from echo_tune.workload.recording.context import finish_collective, record_collective, start_collective


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _gathered(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """The dim-0 gather of ``x`` over ``group_size`` ranks (shape only)."""
    return x.new_empty((x.shape[0] * group_size, *x.shape[1:]))


def _scattered(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """This rank's dim-0 shard of ``x`` over ``group_size`` ranks (shape only)."""
    return x.new_empty((x.shape[0] // group_size, *x.shape[1:]))


def all_gather(x: torch.Tensor, group: str, group_size: int) -> torch.Tensor:
    """Gather ``x`` along dim 0 from ``group_size`` ranks (size: the gathered output)."""
    if group_size == 1:
        return x
    out = _gathered(x, group_size)
    record_collective("all_gather", group, _nbytes(out), group_size)
    return out


def reduce_scatter(x: torch.Tensor, group: str, group_size: int) -> torch.Tensor:
    """Sum ``x`` over ``group`` and keep this rank's dim-0 shard (size: the full input)."""
    if group_size == 1:
        return x
    record_collective("reduce_scatter", group, _nbytes(x), group_size)
    return _scattered(x, group_size)


def all_reduce(x: torch.Tensor, group: str, group_size: int) -> torch.Tensor:
    """Sum ``x`` over ``group`` in place (size: the buffer)."""
    record_collective("all_reduce", group, _nbytes(x), group_size)
    return x


class _ReduceFromTP(Function):
    @staticmethod
    def forward(ctx, x, tp):
        return all_reduce(x, "tp", tp).view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ReduceScatterToSP(Function):
    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return reduce_scatter(x, "tp", tp)

    @staticmethod
    def backward(ctx, grad):
        return all_gather(grad, "tp", ctx.tp), None


class _GatherFromSP(Function):
    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return all_gather(x, "tp", tp)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter(grad, "tp", ctx.tp), None


def gather_from_sp(x: torch.Tensor, tp: int) -> torch.Tensor:
    """All-gather the sequence shards forward, reduce-scatter the gradient backward (Megatron
    ``gather_from_sequence_parallel_region`` with its default ``tensor_parallel_output_grad=True``)."""
    return _GatherFromSP.apply(x, tp) if tp > 1 else x


def reduce_from_tp(x: torch.Tensor, tp: int) -> torch.Tensor:
    """All-reduce forward, identity backward (Megatron ``reduce_from_tensor_model_parallel_region``)."""
    return _ReduceFromTP.apply(x, tp) if tp > 1 else x


def reduce_scatter_to_sp(x: torch.Tensor, tp: int) -> torch.Tensor:
    """Reduce-scatter forward, all-gather backward (``reduce_scatter_to_sequence_parallel_region``)."""
    return _ReduceScatterToSP.apply(x, tp) if tp > 1 else x


def reduce_output(x: torch.Tensor, tp: int, sequence_parallel: bool) -> torch.Tensor:
    """The reduction after a row-parallel linear: reduce-scatter with SP, else all-reduce."""
    return reduce_scatter_to_sp(x, tp) if sequence_parallel else reduce_from_tp(x, tp)


class _ParallelLinear(Function):
    """y = gather?(x) @ W^T (+ b) with Megatron's backward communication."""

    @staticmethod
    def forward(ctx, x, weight, bias, tp, gather_input, allreduce_dgrad):
        ctx.save_for_backward(x, weight)  # the sequence shard only, when gathering
        ctx.tp, ctx.gather_input, ctx.allreduce_dgrad = tp, gather_input, allreduce_dgrad
        ctx.has_bias = bias is not None
        total = all_gather(x, "tp", tp) if gather_input else x
        out = torch.matmul(total, weight.t())
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx, grad):
        # Megatron's order (core/tensor_parallel/layers.py, LinearWithGradAccumulationAndAsyncCommunication,
        # d98e8a64ddf3; TE's Linear the same): the input's re-gather runs beside the dgrad GEMM, dgrad's
        # reduction beside the wgrad GEMM, each waited for after its GEMM (async_op=True)
        x, weight = ctx.saved_tensors
        tp = ctx.tp
        if ctx.gather_input:  # re-gather the sequence shard for the wgrad
            total = _gathered(x, tp)
            gathering = start_collective("all_gather", "tp", _nbytes(total), tp)
        else:
            total, gathering = x, None
        grad_input = grad.matmul(weight)
        finish_collective(gathering)
        handle = None
        if ctx.gather_input:
            handle = start_collective("reduce_scatter", "tp", _nbytes(grad_input), tp)
            grad_input = _scattered(grad_input, tp)
        elif ctx.allreduce_dgrad:
            handle = start_collective("all_reduce", "tp", _nbytes(grad_input), tp)
        grad_2d = grad.reshape(-1, grad.shape[-1])
        grad_weight = grad_2d.t().matmul(total.reshape(-1, total.shape[-1]))
        finish_collective(handle)
        grad_bias = grad_2d.sum(0) if ctx.has_bias else None
        return grad_input, grad_weight, grad_bias, None, None, None


def column_parallel_linear(x, weight, bias, tp: int, sequence_parallel: bool) -> torch.Tensor:
    """Column-parallel linear: input replicated (or gathered under SP), output sharded over TP."""
    gather = sequence_parallel and tp > 1
    return _ParallelLinear.apply(x, weight, bias, tp, gather, tp > 1 and not gather)


def row_parallel_linear(x, weight, tp: int, sequence_parallel: bool) -> torch.Tensor:
    """Row-parallel linear without bias (Megatron adds it after the reduction), then the reduction."""
    out = _ParallelLinear.apply(x, weight, None, tp, False, False)
    return reduce_output(out, tp, sequence_parallel)
