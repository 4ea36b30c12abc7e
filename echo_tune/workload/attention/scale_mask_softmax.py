"""The local spec's attention softmax: Megatron's ``FusedScaleMaskSoftmax`` and its torch fallback.

NVIDIA/Megatron-LM d98e8a64ddf3 core/fusions/fused_softmax.py: ``DotProductAttention`` (the only core
attention of ``--transformer-impl local``) runs the fused causal kernel
``scaled_upper_triang_masked_softmax`` when ``is_kernel_available`` (``--masked-softmax-fusion`` on,
fp16/bf16 scores, ``16 < sk <= 4096``, sq, sk and b * heads multiples of 4, b * heads a multiple of the
kernel's batches per block) and there are no attention sinks; otherwise ``forward_torch_softmax``:
fp32 cast (``--attention-softmax-in-fp32`` / ``--apply-query-key-layer-scaling``), the layer-scaling
multiply, a fresh causal mask (core/transformer/utils.py ``get_default_causal_mask``: ones, triu, bool),
the in-place ``masked_fill_`` (``attention_mask_func``), softmax (``SoftmaxOne`` with sinks) and the
cast back. Autograd keeps the softmax output (fp32 when cast) and the bool mask.
"""

from __future__ import annotations

import torch

import echo_tune.workload.recording.kernels  # noqa: F401  (registers the echo_tune:: ops)

FUSED_MAX_KEYS = 4096
"""``is_kernel_available``: ``16 < sk <= 4096`` (fused_softmax.py)."""


def batches_per_block(sk: int) -> int:
    """Rows one CUDA block of the fused kernel takes: ``get_batch_per_block`` of Apex's
    csrc/megatron/scaled_masked_softmax.h (128 threads per block; a warp is min(32, next pow2 of sk)
    lanes and takes two rows when next pow2 of sk <= 128, else one)."""
    pow2 = 1 << max(0, (sk - 1).bit_length())
    warp = min(pow2, 32)
    return (128 // warp) * (2 if pow2 <= 128 else 1)


def fused_kernel_available(*, fusion: bool, precision: str, batches: int, sq: int, sk: int) -> bool:
    """``FusedScaleMaskSoftmax.is_kernel_available`` for a causal mask (``batches`` = b * heads)."""
    return (fusion and precision in ("fp16", "bf16") and 16 < sk <= FUSED_MAX_KEYS and sq % 4 == 0
            and sk % 4 == 0 and batches % 4 == 0 and batches % batches_per_block(sk) == 0)


def torch_softmax(scores: torch.Tensor, *, in_fp32: bool, layer_scaling: bool, micro_batch: int,
                  offset: torch.Tensor | None = None) -> torch.Tensor:
    """``forward_torch_softmax`` on scores [b * heads, sq, sk] (already scaled by 1/sqrt(d) in the GEMM)."""
    dtype = scores.dtype
    x = scores.float() if in_fp32 and dtype != torch.float32 else scores
    if layer_scaling:
        x = x * 2.0  # coeff = the layer number; its value changes no cost
    sq, sk = x.shape[-2:]
    mask = torch.triu(torch.ones(sq, sk, device=x.device), diagonal=1).bool()
    x = x.masked_fill_(mask, -10000.0)
    if offset is None:
        probs = torch.softmax(x, dim=-1)
    else:  # SoftmaxOne: a sink column per head, softmax over sk + 1, the sink dropped
        b = micro_batch
        x4 = x.view(b, -1, sq, sk)
        sink = offset.to(x.dtype).reshape(1, -1, 1, 1).expand(b, -1, sq, -1)
        probs = torch.softmax(torch.cat([x4, sink], dim=-1), dim=-1)[..., :-1].reshape(-1, sq, sk)
    return probs.to(dtype) if probs.dtype != dtype else probs


def local_softmax(shard, offset: torch.Tensor | None = None):
    """The softmax the local spec runs for this shard, as ``f(scores, scale) -> probs``; None under
    Transformer Engine (its unfused backend keeps the fused kernel, workload/attention/core_attention.py)."""
    m = shard.model
    if not m.local_spec:
        return None
    if offset is None and m.softmax_type == "off-by-one":  # a constant zero per head (dot_product_attention.py)
        offset = shard.tensor(shard.heads)

    def softmax(scores: torch.Tensor, scale: float) -> torch.Tensor:
        batches, sq, sk = scores.shape
        if offset is None and fused_kernel_available(fusion=m.masked_softmax_fusion, precision=shard.precision,
                                                     batches=batches, sq=sq, sk=sk):
            return torch.ops.echo_tune.scaled_upper_triang_masked_softmax(scores, scale)
        return torch_softmax(scores, in_fp32=m.softmax_in_fp32, layer_scaling=m.apply_query_key_layer_scaling,
                             micro_batch=shard.micro_batch_size, offset=offset)

    return softmax
