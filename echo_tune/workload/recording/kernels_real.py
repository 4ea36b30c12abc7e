"""Real CPU and CUDA implementations of the ``echo_tune::`` fused kernels (``kernels.py`` has meta only).

Imported by ``echo-tune profile`` (which times each traced op with real tensors) and ``echo-tune
emulate`` (which runs a pipeline stage for real); tracing never needs them. Each implementation
returns the same tensors, shapes and dtypes as the fake one, so a traced op and its measured time
stay the same op.

- ``flash_attn``: on CPU, aten's flash kernel (``_scaled_dot_product_flash_attention_for_cpu``); on
  CUDA in bf16/fp16, aten's FlashAttention-2 kernel (``_scaled_dot_product_flash_attention``); both
  return the fp32 logsumexp the backward needs. fp32 on CUDA uses the math path below. Grouped-query
  K/V heads are repeated for their query heads (and their gradients summed back).
- the others are short sequences of aten ops with the fused kernel's inputs and outputs (on a GPU
  they are several kernels where Megatron / Transformer Engine run one: the op-time database stores
  what this implementation costs, and ``emulate`` runs the same implementation).
"""

from __future__ import annotations

import warnings

import torch

from echo_tune.workload.recording import kernels
from echo_tune.workload.attention import window_attention

aten = torch.ops.aten
DEVICES = ("cpu", "cuda")


def _up(t: torch.Tensor) -> torch.Tensor:
    """At least fp32 (bf16 / fp16 math in fp32, as the fused kernels do; fp64 kept for gradient checks)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _bhsd(t: torch.Tensor, heads: int) -> torch.Tensor:
    """[s, b, g, d] -> [b, heads, s, d], repeating each of the g K/V heads for heads / g queries."""
    t = t.permute(1, 2, 0, 3)
    return t.repeat_interleave(heads // t.shape[1], dim=1) if t.shape[1] != heads else t


def _fold(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """[b, heads, s, d] gradient -> [s, b, groups, d], summing the repeated heads."""
    b, heads, s, d = grad.shape
    if heads != groups:
        grad = grad.view(b, groups, heads // groups, s, d).sum(2)
    return grad.permute(2, 0, 1, 3).contiguous()


def _math_forward(q, k, v, causal: bool, scale: float, mask=None):
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    elif causal:
        s_q, s_k = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v.float()).to(q.dtype)
    return out, lse


def _math_backward(dout, q, k, v, out, lse, causal: bool, scale: float, mask=None):
    qf, kf, vf, df = q.float(), k.float(), v.float(), dout.float()
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, float("-inf"))
    elif causal:
        s_q, s_k = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    probs = torch.exp(scores - lse.unsqueeze(-1))
    dv = torch.matmul(probs.transpose(-1, -2), df)
    dprobs = torch.matmul(df, vf.transpose(-1, -2))
    dscores = probs * (dprobs - (df * out.float()).sum(-1, keepdim=True)) * scale
    return (torch.matmul(dscores, kf).to(q.dtype), torch.matmul(dscores.transpose(-1, -2), qf).to(k.dtype),
            dv.to(v.dtype))


def _use_cuda_flash(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)


def _padded_v(v: torch.Tensor, d: int) -> torch.Tensor:
    """V with zero columns up to the query/key head size ``d``: torch's flash kernels need one head size, MLA
    has two (DeepSeek-V3: 192 for q/k, 128 for v). Exact (the zero columns add nothing to P @ V or its
    gradients); the time is that of a d-wide V (cuDNN's fused attention runs the narrower V natively)."""
    return v if v.shape[-1] == d else torch.nn.functional.pad(v, (0, d - v.shape[-1]))


def flash_attn_real(q, k, v, causal: bool, scale: float):
    s, b, heads, d = q.shape
    dv = v.shape[-1]
    v = _padded_v(v, d)
    qb, kb, vb = _bhsd(q, heads), _bhsd(k, heads), _bhsd(v, heads)
    if q.is_cuda and _use_cuda_flash(q):
        out, lse = aten._scaled_dot_product_flash_attention(qb, kb, vb, 0.0, causal, False, scale=scale)[:2]
    elif q.is_cuda:
        out, lse = _math_forward(qb, kb, vb, causal, scale)
    else:
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(qb, kb, vb, 0.0, causal, scale=scale)
    return out[..., :dv].permute(2, 0, 1, 3).contiguous(), lse.float().contiguous()


def flash_attn_backward_real(dout, q, k, v, out, lse, causal: bool, scale: float):
    s, b, heads, d = q.shape
    width = v.shape[-1]
    v, out, dout = _padded_v(v, d), _padded_v(out, d), _padded_v(dout, d)
    qb, kb, vb = _bhsd(q, heads), _bhsd(k, heads), _bhsd(v, heads)
    ob, db = _bhsd(out, heads), _bhsd(dout, heads)
    if _use_cuda_flash(q):
        try:  # not yet run on a GPU: None passes undefined tensors (no varlen, no dropout RNG state)
            dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
                db, qb, kb, vb, ob, lse, None, None, s, k.shape[0], 0.0, causal, None, None, scale=scale)
        except (RuntimeError, TypeError) as exc:
            warnings.warn(f"echo_tune::flash_attn_backward: aten's flash backward refused ({exc}); "
                          f"using the math backward, whose time differs", stacklevel=2)
            dq, dk, dv = _math_backward(db, qb, kb, vb, ob, lse, causal, scale)
    elif q.is_cuda:
        dq, dk, dv = _math_backward(db, qb, kb, vb, ob, lse, causal, scale)
    else:
        dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
            db, qb, kb, vb, ob, lse, 0.0, causal, scale=scale)
    return _fold(dq, heads), _fold(dk, k.shape[2]), _fold(dv, v.shape[2])[..., :width].contiguous()


def window_attn_real(q, k, v, causal: bool, window_left: int, scale: float):
    """The math path with the band mask (correct values; a real windowed kernel's time differs)."""
    heads = q.shape[2]
    mask = window_attention.band_mask(q.shape[0], k.shape[0], window_left, q.device)
    out, lse = _math_forward(_bhsd(q, heads), _bhsd(k, heads), _bhsd(v, heads), causal, scale, mask)
    return out.permute(2, 0, 1, 3).contiguous(), lse.float().contiguous()


def window_attn_backward_real(dout, q, k, v, out, lse, causal: bool, window_left: int, scale: float):
    heads = q.shape[2]
    mask = window_attention.band_mask(q.shape[0], k.shape[0], window_left, q.device)
    dq, dk, dv = _math_backward(_bhsd(dout, heads), _bhsd(q, heads), _bhsd(k, heads), _bhsd(v, heads),
                                _bhsd(out, heads), lse, causal, scale, mask)
    return _fold(dq, heads), _fold(dk, k.shape[2]), _fold(dv, v.shape[2])


def masked_softmax_real(x, scale: float):
    s_q, s_k = x.shape[-2:]
    mask = torch.ones(s_q, s_k, dtype=torch.bool, device=x.device).triu(1)
    return torch.softmax((x * scale).masked_fill(mask, float("-inf")), dim=-1, dtype=_up(x).dtype).to(x.dtype)


def masked_softmax_backward_real(dy, y, scale: float):
    yf, dyf = _up(y), _up(dy)
    return (yf * (dyf - (dyf * yf).sum(-1, keepdim=True)) * scale).to(dy.dtype)


def swiglu_real(x):
    a, b = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(a) * b


def swiglu_backward_real(dy, x):
    a, b = x.chunk(2, dim=-1)
    sig = torch.sigmoid(_up(a))
    silu = _up(a) * sig
    da = _up(dy) * _up(b) * (sig * (1 + _up(a) * (1 - sig)))
    return torch.cat([da.to(x.dtype), (_up(dy) * silu).to(x.dtype)], dim=-1)


def rms_norm_real(x, weight, eps: float):
    xf = _up(x)
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    return (xf * rstd.unsqueeze(-1)).to(x.dtype) * weight, rstd


def rms_norm_backward_real(dy, x, weight, rstd):
    xf, dyf = _up(x), _up(dy)
    xhat = xf * rstd.unsqueeze(-1)
    dweight = (dyf * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
    g = dyf * _up(weight)
    dx = rstd.unsqueeze(-1) * (g - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx.to(x.dtype), dweight


def _rotate_half(t):
    t1, t2 = t.chunk(2, dim=-1)
    return torch.cat([-t2, t1], dim=-1)


def rope_real(t, freqs):
    cos, sin = freqs.cos().to(t.dtype), freqs.sin().to(t.dtype)
    return t * cos + _rotate_half(t) * sin


def rope_backward_real(dy, freqs):
    cos, sin = freqs.cos().to(dy.dtype), freqs.sin().to(dy.dtype)
    u1, u2 = (dy * sin).chunk(2, dim=-1)
    return dy * cos + torch.cat([u2, -u1], dim=-1)


def rope_partial_real(t, freqs):
    rot = freqs.shape[-1]
    return torch.cat((rope_real(t[..., :rot], freqs), t[..., rot:]), dim=-1)


def rope_partial_backward_real(dy, freqs):
    rot = freqs.shape[-1]
    return torch.cat((rope_backward_real(dy[..., :rot], freqs), dy[..., rot:]), dim=-1)


_IMPLEMENTATIONS = {
    kernels.flash_attn: flash_attn_real, kernels.flash_attn_backward: flash_attn_backward_real,
    kernels.masked_softmax: masked_softmax_real, kernels.masked_softmax_backward: masked_softmax_backward_real,
    kernels.swiglu: swiglu_real, kernels.swiglu_backward: swiglu_backward_real,
    kernels.rms_norm: rms_norm_real, kernels.rms_norm_backward: rms_norm_backward_real,
    kernels.rope: rope_real, kernels.rope_backward: rope_backward_real,
    kernels.rope_partial: rope_partial_real, kernels.rope_partial_backward: rope_partial_backward_real,
    window_attention.window_attn: window_attn_real,
    window_attention.window_attn_backward: window_attn_backward_real,
}
for _op, _impl in _IMPLEMENTATIONS.items():
    _op.register_kernel(DEVICES, _impl)
