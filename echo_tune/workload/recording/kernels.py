"""Megatron's fused kernels as ``torch.library`` custom ops that run on the ``meta`` device.

Each fused kernel is one op forward and one op backward (as on the GPU), with the tensors it really
saves for backward. Only fake (meta) implementations exist: these ops are for tracing, not compute.

- ``echo_tune::flash_attn``: flash attention, layout [s, b, heads, head_dim]; saves q, k, v, out and
  the fp32 logsumexp [b, heads, s_q], never the s x s score matrix.
- ``echo_tune::scaled_upper_triang_masked_softmax``: Megatron's fused causal scale-mask-softmax over
  [b*heads, s_q, s_kv]; saves its output.
- ``echo_tune::swiglu``: Megatron's fused SwiGLU over the fc1 output [..., 2f]; saves its input.
- ``echo_tune::rms_norm``: Transformer Engine's fused RMSNorm; saves input and the fp32 rstd.
- ``echo_tune::rope``: fused rotary embedding; saves only the (constant) frequency table.
"""

from __future__ import annotations

import torch
import torch._dynamo  # noqa: F401  custom ops pull it in on their first call (~1 s); pay it at import

_NS = "echo_tune"
FLASH_BACKWARD_FACTOR = 2.5
"""Flash backward FLOPs over forward FLOPs (recomputes QK^T, plus dQ, dK, dV, dP: 5 GEMMs vs 2)."""


def _meta_only(*_args, **_kwargs):
    raise NotImplementedError("echo_tune kernels only run on the meta device (tracing)")


def _define(name: str, signature: str, fake):
    """Define ``echo_tune::name`` with a fake (meta) implementation; return its default overload."""
    lib_op = torch.library.custom_op(f"{_NS}::{name}", _meta_only, mutates_args=(), schema=signature)
    lib_op.register_fake(fake)
    return lib_op


# --- flash attention ---
flash_attn = _define(
    "flash_attn", "(Tensor q, Tensor k, Tensor v, bool causal, float scale) -> (Tensor, Tensor)",
    lambda q, k, v, causal, scale: (q.new_empty((*q.shape[:-1], v.shape[-1])),
                                    q.new_empty((q.shape[1], q.shape[2], q.shape[0]), dtype=torch.float32)))
flash_attn_backward = _define(
    "flash_attn_backward",
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float scale)"
    " -> (Tensor, Tensor, Tensor)",
    lambda dout, q, k, v, out, lse, causal, scale: (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)))


def _flash_setup(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    out, lse = output
    ctx.set_materialize_grads(False)  # the logsumexp gets no gradient: no zero-fill kernel
    ctx.mark_non_differentiable(lse)
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale = causal, scale


def _flash_backward(ctx, dout, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.echo_tune.flash_attn_backward(dout, q, k, v, out, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


flash_attn.register_autograd(_flash_backward, setup_context=_flash_setup)


def score_pairs(s_q: int, s_kv: int, causal: bool) -> float:
    """(query, key) pairs one head attends: s_q * s_kv, halved when causal; with more keys than queries the causal
    mask is bottom-right aligned (the queries are the last s_q of the keys' sequence: cuDNN's and flash-attention's
    ``causal_bottom_right``, as TE's all-gather context parallelism runs it), s_q * s_kv - s_q^2 / 2."""
    if not causal:
        return float(s_q * s_kv)
    if s_kv > s_q:
        return s_q * s_kv - s_q * s_q / 2.0
    return s_q * s_kv * 0.5


def flash_forward_flops(q_shape, k_shape, causal: bool, v_shape=None) -> float:
    """2 * b * heads * pairs * (d_qk + d_v) (QK^T and PV) over the attended (query, key) pairs (``score_pairs``:
    masked blocks are skipped); d_v = d_qk unless the value head differs (MLA)."""
    s_q, b, heads, d = q_shape
    s_kv = k_shape[0]
    d_v = v_shape[-1] if v_shape is not None else d
    return 2.0 * b * heads * score_pairs(s_q, s_kv, causal) * (d + d_v)


# --- fused causal softmax ---
masked_softmax = _define("scaled_upper_triang_masked_softmax", "(Tensor x, float scale) -> Tensor",
                         lambda x, scale: torch.empty_like(x))
masked_softmax_backward = _define("scaled_upper_triang_masked_softmax_backward",
                                  "(Tensor dy, Tensor y, float scale) -> Tensor",
                                  lambda dy, y, scale: torch.empty_like(dy))


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _softmax_backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return torch.ops.echo_tune.scaled_upper_triang_masked_softmax_backward(dy, y, ctx.scale), None


masked_softmax.register_autograd(_softmax_backward, setup_context=_softmax_setup)

# --- fused SwiGLU ---
swiglu = _define("swiglu", "(Tensor x) -> Tensor",
                 lambda x: x.new_empty((*x.shape[:-1], x.shape[-1] // 2)))
swiglu_backward = _define("swiglu_backward", "(Tensor dy, Tensor x) -> Tensor",
                          lambda dy, x: torch.empty_like(x))


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _swiglu_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return torch.ops.echo_tune.swiglu_backward(dy, x)


swiglu.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)

# --- fused RMSNorm ---
rms_norm = _define("rms_norm", "(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)",
                   lambda x, weight, eps: (torch.empty_like(x), x.new_empty(x.shape[:-1], dtype=torch.float32)))
rms_norm_backward = _define("rms_norm_backward", "(Tensor dy, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)",
                            lambda dy, x, weight, rstd: (torch.empty_like(x), torch.empty_like(weight)))


def _rms_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(inputs[0], inputs[1], output[1])


def _rms_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = torch.ops.echo_tune.rms_norm_backward(dy, x, weight, rstd)
    return dx, dweight, None


rms_norm.register_autograd(_rms_backward, setup_context=_rms_setup)

# --- fused rotary embedding ---
rope = _define("rope", "(Tensor t, Tensor freqs) -> Tensor", lambda t, freqs: torch.empty_like(t))
rope_backward = _define("rope_backward", "(Tensor dy, Tensor freqs) -> Tensor",
                        lambda dy, freqs: torch.empty_like(dy))


def _rope_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _rope_backward(ctx, dy):
    (freqs,) = ctx.saved_tensors
    return torch.ops.echo_tune.rope_backward(dy, freqs), None


rope.register_autograd(_rope_backward, setup_context=_rope_setup)

# --- fused rotary embedding over the first rotary_dim channels of each head (--rotary-percent < 1) ---
rope_partial = _define("rope_partial", "(Tensor t, Tensor freqs) -> Tensor", lambda t, freqs: torch.empty_like(t))
rope_partial_backward = _define("rope_partial_backward", "(Tensor dy, Tensor freqs) -> Tensor",
                                lambda dy, freqs: torch.empty_like(dy))


def _rope_partial_backward(ctx, dy):
    (freqs,) = ctx.saved_tensors
    return torch.ops.echo_tune.rope_partial_backward(dy, freqs), None


rope_partial.register_autograd(_rope_partial_backward, setup_context=_rope_setup)


def _flash_fwd_flops(args) -> float:
    q, k, v, causal = args[:4]
    return flash_forward_flops(q.shape, k.shape, causal, v.shape)


def _flash_bwd_flops(args) -> float:
    _dout, q, k, v, _out, _lse, causal = args[:7]
    return FLASH_BACKWARD_FACTOR * flash_forward_flops(q.shape, k.shape, causal, v.shape)


def flash_scores(q_shape, k_shape, causal: bool) -> float:
    """b * heads * (attended pairs, ``score_pairs``) attention scores: one exponential each per pass."""
    s_q, b, heads, _ = q_shape
    return float(b * heads) * score_pairs(s_q, k_shape[0], causal)


ATTENTION_EXPS = {
    torch.ops.echo_tune.flash_attn: lambda args: flash_scores(args[0].shape, args[1].shape, args[3]),
    torch.ops.echo_tune.flash_attn_backward: lambda args: flash_scores(args[1].shape, args[2].shape, args[6]),
}
"""Exponentials of each attention op: one per score forward, one per score backward (P recomputed from the LSE)."""

ATTENTION_CAUSAL_ARG = {
    torch.ops.echo_tune.flash_attn: 3,
    torch.ops.echo_tune.flash_attn_backward: 6,
}
"""Position of the ``causal`` argument of each attention op."""

ATTENTION_FLOPS = {
    torch.ops.echo_tune.flash_attn: _flash_fwd_flops,
    torch.ops.echo_tune.flash_attn_backward: _flash_bwd_flops,
}
"""FLOP formulas of the ops the tracer classifies as kind "attention", by overload packet."""
