"""Context-parallel attention other than the ring: all-gather of K/V, Ulysses all-to-all, and both levels of a2a+p2p.

Transformer Engine d0067d0 pytorch/attention/dot_product_attention/context_parallel.py (config/rules/cp_comm_rules.py says
which Megatron runs). Inputs are one rank's q [s, b, heads, d], k and v [s, b, groups, d] (s: its two load-balanced
sequence chunks); the output is [s, b, heads * d_v].

- ``all_gather`` (``AttnFuncWithCPAndKVAllGather``): K and V all-gathered over CP (``gather_along_first_dim``) and
  put in sequence order (``index_select``: a copy of each); each of the rank's two query chunks (chunk ids ``rank``
  and ``2 cp - 1 - rank``) attends the keys up to its own end, causal bottom-right: two attention kernels. Local
  q, k, v and the output are saved. Backward gathers K and V again, runs the two backward kernels into full-length
  dK / dV (an add per step), reorders them (a copy) and reduce-scatters them. The gathers and reduce-scatters are on
  the critical path (TE: "KV all-gather between CP ranks is exposed"). Traced for rank 0 (chunks 0 and 2cp - 1:
  every rank attends the same number of (query, key) pairs).
- ``a2a`` (``AttnFuncWithCPAndQKVOA2A``, ``flash_attn_a2a_communicate``): q, k and v each go through a copy
  (``movedim(...).contiguous()``), an ``all_to_all_single`` over CP and a reorder (``index_select``), leaving the
  whole sequence with heads / CP; attention runs there as without CP (workload/attention/core_attention.py); the output goes back
  the same way (reorder, all-to-all, copy). Backward mirrors it (dout in; dq, dk, dv out). Exposed all-to-alls.
- ``a2a+p2p``: the all-to-alls over the first hierarchical level ("cp_a2a"), the ring of ``p2p`` over the second
  ("cp_p2p") inside (``AttnFuncWithCPAndKVP2P`` with ``cp_group = [a2a group, p2p group]``).
"""

from __future__ import annotations

import math

import torch
from torch.autograd import Function

import echo_tune.workload.recording.kernels  # noqa: F401  (registers the echo_tune:: ops)
from echo_tune.workload.recording.context import record_collective

_ops = torch.ops.echo_tune


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _exchange(x: torch.Tensor, group: str, size: int, gather_sequence: bool) -> torch.Tensor:
    """One ``flash_attn_a2a_communicate`` tensor: copy, all-to-all of its bytes, reorder copy. ``gather_sequence``:
    heads scattered, sequence gathered ([s, b, h, d] -> [s * size, b, h / size, d]); else the way back."""
    s, b, h, d = x.shape
    staged = x.clone()  # movedim(...).contiguous() before the all-to-all (or the reorder, on the way back)
    record_collective("all_to_all", group, _nbytes(x), size)
    shape = (s * size, b, h // size, d) if gather_sequence else (s // size, b, h * size, d)
    return staged.new_empty(shape).clone()  # the reorder (index_select), or movedim(...).contiguous(), after it


class _AllToAll(Function):
    """``_exchange`` forward; the gradient goes back the other way (TE's backward exchanges dout, then dq/dk/dv)."""

    @staticmethod
    def forward(ctx, x, group, size, gather_sequence):
        ctx.group, ctx.size, ctx.gather_sequence = group, size, gather_sequence
        return _exchange(x, group, size, gather_sequence)

    @staticmethod
    def backward(ctx, dy):
        return _exchange(dy, ctx.group, ctx.size, not ctx.gather_sequence), None, None, None


def ulysses(q, k, v, group: str, size: int, attend) -> torch.Tensor:
    """All-to-alls of q, k, v over ``group`` (``size`` ranks), ``attend(q, k, v)`` over the gathered sequence
    (returns [s * size, b, heads / size * d_v]), then the output's all-to-all back: [s, b, heads * d_v]."""
    q, k, v = (_AllToAll.apply(t, group, size, True) for t in (q, k, v))
    out = attend(q, k, v)
    s, b = out.shape[:2]
    heads = q.shape[2]
    out = _AllToAll.apply(out.view(s, b, heads, -1), group, size, False)
    return out.reshape(out.shape[0], b, -1)


class _KVAllGather(Function):
    """TE's all-gather context parallelism for rank 0 (see the module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, cp):
        scale = 1.0 / math.sqrt(q.shape[-1])
        k_all, v_all = _gathered(k, v, cp)
        half = q.shape[0] // 2
        out0, lse0 = _ops.flash_attn(q[:half], k_all[:half], v_all[:half], True, scale)  # chunk 0: the diagonal
        out1, lse1 = _ops.flash_attn(q[half:], k_all, v_all, True, scale)  # chunk 2cp-1: every key, bottom-right
        out = torch.cat((out0, out1))
        ctx.save_for_backward(q, k, v, out, lse0, lse1)
        ctx.cp, ctx.scale = cp, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse0, lse1 = ctx.saved_tensors
        cp, half = ctx.cp, q.shape[0] // 2
        k_all, v_all = _gathered(k, v, cp)  # gathered again (not saved)
        dq0, dk0, dv0 = _ops.flash_attn_backward(dout[:half], q[:half], k_all[:half], v_all[:half], out[:half], lse0,
                                                 True, ctx.scale)
        dq1, dk_all, dv_all = _ops.flash_attn_backward(dout[half:], q[half:], k_all, v_all, out[half:], lse1, True,
                                                       ctx.scale)
        dk_all[:half].add_(dk0)
        dv_all[:half].add_(dv0)
        dq = torch.cat((dq0, dq1))
        dk, dv = (t.clone() for t in (dk_all, dv_all))  # back to the ranks' chunk order (index_select)
        for t in (dk, dv):
            record_collective("reduce_scatter", "cp", _nbytes(t), cp)
        return dq, dk[: k.shape[0]], dv[: v.shape[0]], None


def _gathered(k, v, cp):
    """K and V of every CP rank, in sequence order: an all-gather (output bytes) and a reorder copy each."""
    out = []
    for t in (k, v):
        record_collective("all_gather", "cp", _nbytes(t) * cp, cp)
        out.append(t.new_empty((t.shape[0] * cp, *t.shape[1:])).clone())
    return out


def kv_all_gather_attention(q, k, v, cp: int) -> torch.Tensor:
    s, b = q.shape[:2]
    return _KVAllGather.apply(q, k, v, cp).reshape(s, b, -1)
