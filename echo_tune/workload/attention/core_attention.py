"""Core attention (the "core_attention" region): unfused, flash, and ring attention for context parallel.

Inputs are one rank's heads in Megatron's layout: q [s, b, heads, d], k and v [s, b, groups, d].
The output is the context [s, b, heads * d] that feeds the row-parallel output projection.
"""

from __future__ import annotations

import math

import torch
from torch.autograd import Function

import echo_tune.workload.recording.kernels  # noqa: F401  (registers the echo_tune:: ops)
from echo_tune.workload.recording.context import record_collective
from echo_tune.workload.attention.window_attention import window_flash_attention
from echo_tune.workload.attention import cp_attention

_ops = torch.ops.echo_tune


def unfused_attention(q, k, v, dropout_p: float, softmax=None) -> torch.Tensor:
    """Megatron's local attention: bmm QK^T, fused causal scale-mask-softmax, dropout, bmm with V.

    Keeps for backward the s x s softmax output, the dropout mask and the dropout output (the
    5as/h term of Korthikanti et al.), besides q, k and v. ``softmax(scores, scale)``: the local
    spec's choice between that kernel and torch ops (workload/attention/scale_mask_softmax.py); None: the kernel.
    """
    s, b, heads, d = q.shape
    if k.shape[2] != heads:  # grouped-query attention: repeat each K/V head for its query heads
        k = k.repeat_interleave(heads // k.shape[2], dim=2)
        v = v.repeat_interleave(heads // v.shape[2], dim=2)
    q_b = q.reshape(s, b * heads, d).transpose(0, 1)
    k_b = k.reshape(s, b * heads, d).transpose(0, 1)
    v_b = v.reshape(s, b * heads, v.shape[-1]).transpose(0, 1)  # MLA: v_head_dim differs from d
    scores = torch.bmm(q_b, k_b.transpose(1, 2))  # [b*heads, s, s]
    scale = 1.0 / math.sqrt(d)
    probs = softmax(scores, scale) if softmax else _ops.scaled_upper_triang_masked_softmax(scores, scale)
    if dropout_p > 0:
        probs, _mask = torch.native_dropout(probs, dropout_p, True)
    context = torch.bmm(probs, v_b)  # [b*heads, s, d]
    dv = v_b.shape[-1]  # the value head size (MLA: v_head_dim, not the query/key size)
    return context.view(b, heads, s, dv).permute(2, 0, 1, 3).contiguous().view(s, b, heads * dv)


def flash_attention(q, k, v) -> torch.Tensor:
    """One fused causal flash-attention kernel; keeps q, k, v, the output and the logsumexp."""
    s, b, heads, d = q.shape
    out, _lse = _ops.flash_attn(q, k, v, True, 1.0 / math.sqrt(d))
    return out.reshape(s, b, -1)


def _kv_bytes(k, v) -> int:
    return k.numel() * k.element_size() + v.numel() * v.element_size()


def _merge(out, lse, step_out, step_lse):
    """Combine two partial attention results by their logsumexp (TE's out/lse correction kernels)."""
    new_lse = torch.logaddexp(lse, step_lse)
    old_w = torch.exp(lse - new_lse).to(out.dtype).permute(2, 0, 1).unsqueeze(-1)  # [s, b, heads, 1]
    new_w = torch.exp(step_lse - new_lse).to(out.dtype).permute(2, 0, 1).unsqueeze(-1)
    return out * old_w + step_out * new_w, new_lse


class _RingAttention(Function):
    """Transformer Engine's P2P ring attention, load-balanced over 2*cp sequence chunks.

    Step 0 is the causal diagonal block; each of the cp-1 later steps attends to half of a remote
    K/V block (the load-balanced causal pattern), so a rank does 1/cp of the full causal work. Each
    step but the last prefetches the next K/V block with a send_recv over "cp"; backward also passes
    the partial dK/dV blocks around the ring.
    """
    @staticmethod
    def forward(ctx, q, k, v, cp, group="cp"):
        scale = 1.0 / math.sqrt(q.shape[-1])
        half = k.shape[0] // 2
        out = lse = None
        for step in range(cp):
            if step < cp - 1:
                record_collective("send_recv", group, _kv_bytes(k, v), cp)
            if step == 0:
                out, lse = _ops.flash_attn(q, k, v, True, scale)
            else:
                step_out, step_lse = _ops.flash_attn(q, k[:half], v[:half], False, scale)
                out, lse = _merge(out, lse, step_out, step_lse)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cp, ctx.scale, ctx.group = cp, scale, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        half = k.shape[0] // 2
        dq = dk = dv = None
        for step in range(ctx.cp):
            if step < ctx.cp - 1:
                record_collective("send_recv", ctx.group, _kv_bytes(k, v), ctx.cp)
            if step == 0:
                dq, dk, dv = _ops.flash_attn_backward(dout, q, k, v, out, lse, True, ctx.scale)
                continue
            dq_i, dk_i, dv_i = _ops.flash_attn_backward(dout, q, k[:half], v[:half], out, lse, False, ctx.scale)
            dq.add_(dq_i)
            dk[:half].add_(dk_i)
            dv[:half].add_(dv_i)
            record_collective("send_recv", ctx.group, _kv_bytes(k, v), ctx.cp)  # pass dK/dV on
        return dq, dk, dv, None, None


def ring_attention(q, k, v, cp: int, group: str = "cp") -> torch.Tensor:
    """Context-parallel attention over ``cp`` ranks of ``group`` (always the fused kernel, as Megatron requires)."""
    s, b, heads, d = q.shape
    return _RingAttention.apply(q, k, v, cp, group).reshape(s, b, -1)


def te_qkv_layout(q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as Transformer Engine's fused attention reads them (``get_qkv_layout``,
    transformer_engine/pytorch/attention/dot_product_attention/utils.py, TE 2.x).

    Every layout TE reads in place (``sb3hd``, ``sbh3d``, ``sbhd_sb2hd``, ``sbhd_sbh2d``, ``sbhd_sbhd_sbhd``)
    needs ``check_strides_kv``: k's and v's strides, divided by their head size, equal. When they are not
    (``not_supported``), TE makes all three contiguous. That is the grouped-query layout after RoPE (or QK
    norm): Megatron splits the fused QKV output into views ([s, b, groups, (heads / groups + 2) d], attention.py
    ``get_query_key_value_tensors``), RoPE writes new q and k, and v is left a strided view of the QKV output.
    So TE saves a contiguous copy of v, not the view, and the QKV output is freed after the forward, instead
    of being kept whole through the view."""
    def ratios(t):
        return tuple(stride / t.shape[-1] for stride in t.stride()[:-1])

    if ratios(k) != ratios(v):
        q, k, v = (t.contiguous() for t in (q, k, v))
    return q, k, v


def core_attention(q, k, v, *, flash: bool, context_parallel_size: int, dropout_p: float,
                   window_left: int | None = None, softmax=None, te_layout: bool = False,
                   cp_comm: tuple[str, int] = ("p2p", 1)) -> torch.Tensor:
    """Pick the core-attention implementation Megatron would run for these settings.

    ``cp_comm``: (``--cp-comm-type``, all-to-all ranks) with CP: the ring here, the others workload/attention/cp_attention.py.
    ``window_left``: a sliding window of that many keys before each query (workload/attention/window_attention.py);
    the unfused path masks the full s x s scores, so it costs the same with or without it.
    ``softmax``: the local spec's softmax (workload/attention/scale_mask_softmax.py ``local_softmax``).
    ``te_layout``: Transformer Engine's attention (fused kernels), which reads q, k, v as ``te_qkv_layout``."""
    if te_layout and (flash or context_parallel_size > 1):
        q, k, v = te_qkv_layout(q, k, v)
    if context_parallel_size > 1:
        return _cp_attention(q, k, v, context_parallel_size, cp_comm, dropout_p, window_left, softmax)
    if flash and window_left is not None and window_left + 1 < q.shape[0]:
        return window_flash_attention(q, k, v, window_left)
    if flash:
        return flash_attention(q, k, v)
    return unfused_attention(q, k, v, dropout_p, softmax)


def _cp_attention(q, k, v, cp: int, cp_comm: tuple[str, int], dropout_p: float, window_left, softmax):
    """Context parallelism by ``cp_comm`` (config/rules/cp_comm_rules.py): p2p ring, all_gather, a2a, a2a+p2p."""
    kind, a2a = cp_comm
    if kind == "all_gather":
        return cp_attention.kv_all_gather_attention(q, k, v, cp)
    if kind == "a2a":  # TE's fused attention over the whole sequence, heads / CP (a window or sinks as without CP)
        return cp_attention.ulysses(q, k, v, "cp", cp, lambda q, k, v: core_attention(
            q, k, v, flash=True, context_parallel_size=1, dropout_p=dropout_p, window_left=window_left,
            softmax=softmax))
    if kind == "a2a+p2p" and a2a == 1:  # TE: a one-rank all-to-all level runs as p2p over the other
        return ring_attention(q, k, v, cp, "cp_p2p")
    if kind == "a2a+p2p":  # (a one-rank ring level runs as a2a: the ring below has one step and no exchange)
        return cp_attention.ulysses(q, k, v, "cp_a2a", a2a, lambda q, k, v: ring_attention(q, k, v, cp // a2a,
                                                                                          "cp_p2p"))
    return ring_attention(q, k, v, cp)
