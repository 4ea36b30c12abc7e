"""Rotary position embedding of the query and key heads: TE's fused kernel or Megatron's unfused ops.

Megatron-LM d98e8a64ddf3: the rotary table covers ``rotary_dim = int(kv_channels * rotary_percent)``
channels of each head (models/gpt/gpt_model.py builds ``RotaryEmbedding(kv_channels, rotary_percent)``);
the remaining channels pass through. With ``apply_rope_fusion`` (default) TE's fused kernel reads and
writes the whole head once (``echo_tune::rope``, partial rotary included). ``--no-rope-fusion`` runs
models/common/embeddings/rope_utils.py ``_apply_rotary_pos_emb_bshd`` as separate torch kernels:
cos/sin of the table, t * cos + rotate_half(t) * sin on the rotary part, then a cat with the pass-through
part; ``--rotary-interleaved`` rotates (even, odd) pairs instead of the two halves (same bytes).
"""

from __future__ import annotations

import torch

import echo_tune.workload.recording.kernels  # noqa: F401  (registers the echo_tune:: ops)


def rotary_dim(head_dim: int, rotary_percent: float) -> int:
    """Channels of a head that RoPE rotates (``int(kv_channels * rotary_percent)``)."""
    return int(head_dim * rotary_percent)


def _rotate_half(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    if not interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).view(x.shape)


def unfused_rope(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Megatron's ``_apply_rotary_pos_emb_bshd`` (mscale 1): separate elementwise kernels."""
    rot = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot], t[..., rot:]
    cos_, sin_ = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    t_rot = (t_rot * cos_) + (_rotate_half(t_rot, interleaved) * sin_)
    return torch.cat((t_rot, t_pass), dim=-1) if t_pass.shape[-1] else t_rot


def apply_rope(t: torch.Tensor, freqs: torch.Tensor, *, fused: bool, interleaved: bool) -> torch.Tensor:
    """RoPE on [s, b, heads, d] with a [s, 1, 1, rotary_dim] fp32 table."""
    if fused:
        if freqs.shape[-1] == t.shape[-1]:
            return torch.ops.echo_tune.rope(t, freqs)
        return torch.ops.echo_tune.rope_partial(t, freqs)
    return unfused_rope(t, freqs, interleaved)
