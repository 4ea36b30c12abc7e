"""Sliding-window flash attention (``--window-size``): the fused kernel with a left window of w keys.

Under the causal mask with window (w, 0) (TE's ``window_size``, NVIDIA/TransformerEngine d0067d0
dot_product_attention/utils.py ``get_full_mask``: query i sees keys [i - w, i]), query i attends to
min(w + 1, i + 1) keys, so QK^T and PV do ``2 b heads (d_qk + d_v) sum_i min(w + 1, i + 1)`` FLOPs
forward instead of the causal ``2 b heads (d_qk + d_v) s^2 / 2``. The kernel keeps what the causal
flash kernel keeps (q, k, v, output, fp32 logsumexp): no s x s matrix, so the window changes time, not
activation memory. The unfused path (TE's UnfusedDotProductAttention turns the window into an
arbitrary mask over the full s x s scores) costs the same as without a window, so only the flash
kernel has a windowed variant. FLOPs count useful work only: a tiled kernel also computes the masked
part of the tiles the window's edge cuts (up to one key tile per query tile more), not modelled.
"""

from __future__ import annotations

import torch

from echo_tune.workload.recording import kernels

window_attn = kernels._define(
    "flash_attn_window", "(Tensor q, Tensor k, Tensor v, bool causal, int window_left, float scale) -> (Tensor, Tensor)",
    lambda q, k, v, causal, window_left, scale: (
        q.new_empty((*q.shape[:-1], v.shape[-1])),
        q.new_empty((q.shape[1], q.shape[2], q.shape[0]), dtype=torch.float32)))
window_attn_backward = kernels._define(
    "flash_attn_window_backward",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, int window_left, float scale)"
    " -> (Tensor, Tensor, Tensor)",
    lambda dout, q, k, v, out, lse, causal, window_left, scale: (torch.empty_like(q), torch.empty_like(k),
                                                                 torch.empty_like(v)))


def _setup(ctx, inputs, output):
    q, k, v, causal, window_left, scale = inputs
    out, lse = output
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.window_left, ctx.scale = causal, window_left, scale


def _backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.echo_tune.flash_attn_window_backward(dout, q, k, v, out, lse, ctx.causal,
                                                                ctx.window_left, ctx.scale)
    return dq, dk, dv, None, None, None


window_attn.register_autograd(_backward, setup_context=_setup)


def window_key_count(seq: int, window_left: int) -> int:
    """Sum over queries i = 0..seq-1 of the keys each attends to, min(window_left + 1, i + 1)."""
    reach = window_left + 1
    if seq <= reach:
        return seq * (seq + 1) // 2
    return reach * (reach + 1) // 2 + (seq - reach) * reach


def window_forward_flops(q_shape, k_shape, window_left: int, v_shape=None) -> float:
    """2 * b * heads * (d_qk + d_v) * (keys summed over the queries): QK^T and PV inside the window."""
    s_q, b, heads, d = q_shape
    d_v = v_shape[-1] if v_shape is not None else d
    return 2.0 * b * heads * (d + d_v) * window_key_count(s_q, window_left)


def _fwd_flops(args) -> float:
    q, k, v, _causal, window_left = args[:5]
    return window_forward_flops(q.shape, k.shape, window_left, v.shape)


def _bwd_flops(args) -> float:
    _dout, q, k, v, _out, _lse, _causal, window_left = args[:8]
    return kernels.FLASH_BACKWARD_FACTOR * window_forward_flops(q.shape, k.shape, window_left, v.shape)


kernels.ATTENTION_FLOPS[torch.ops.echo_tune.flash_attn_window] = _fwd_flops
kernels.ATTENTION_FLOPS[torch.ops.echo_tune.flash_attn_window_backward] = _bwd_flops
kernels.ATTENTION_EXPS[torch.ops.echo_tune.flash_attn_window] = \
    lambda args: float(args[0].shape[1] * args[0].shape[2] * window_key_count(args[0].shape[0], args[4]))
kernels.ATTENTION_EXPS[torch.ops.echo_tune.flash_attn_window_backward] = \
    lambda args: float(args[1].shape[1] * args[1].shape[2] * window_key_count(args[1].shape[0], args[7]))
kernels.ATTENTION_CAUSAL_ARG[torch.ops.echo_tune.flash_attn_window] = 3
kernels.ATTENTION_CAUSAL_ARG[torch.ops.echo_tune.flash_attn_window_backward] = 6


def window_flash_attention(q, k, v, window_left: int):
    """The windowed causal flash kernel on [s, b, heads, d] inputs; returns the context [s, b, heads * d_v]."""
    s, b, heads, d = q.shape
    out, _lse = torch.ops.echo_tune.flash_attn_window(q, k, v, True, window_left, d ** -0.5)
    return out.reshape(s, b, -1)


def band_mask(s_q: int, s_k: int, window_left: int, device) -> torch.Tensor:
    """True where a key is masked: after the query (causal) or more than ``window_left`` before it."""
    i = torch.arange(s_q, device=device).unsqueeze(-1)
    j = torch.arange(s_k, device=device).unsqueeze(0)
    return (j > i) | (j < i - window_left)
