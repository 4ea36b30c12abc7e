"""``--deterministic-mode``: what Megatron-LM switches on, and what of it echo-tune models.

Megatron-LM d98e8a64ddf3 megatron/training/determinism.py ``apply_determinism_to_args``:
- refuses ``--cross-entropy-loss-fusion`` and ``--tp-comm-overlap`` (ARG_VALUES_REQUIRED_FOR_DETERMINISM):
  a ConfigError from config/rules/determinism_rules.py, checked once with the layout;
- sets NCCL_ALGO=Ring: every collective runs NCCL's ring, never the tree (modelled: the profile's
  ``nccl_ring_only``, cost/collectives/comm.py);
- sets NVTE_ALLOW_NONDETERMINISTIC_ALGO=0: Transformer Engine picks a deterministic attention backward.
  For vanilla softmax on Hopper cuDNN's fused attention (sub-backend 1) and FlashAttention >= 2.4.1
  stay on (TE d0067d0 dot_product_attention/utils.py, "Filter: Determinism"); with attention sinks
  (``--softmax-type`` off-by-one / learnable) TE disables fused attention and runs the unfused
  attention (modelled: ``deterministic_attention_model``). The deterministic backward kernels' own
  slowdown is not modelled, stated in the report's notes: TE lists cuDNN's sub-backend 1 on sm90 as
  deterministic already (no other kernel), and the one public figure is FlashAttention-3's on H100
  (Dao-AILab/flash-attention PR #1893: hdim 128, causal, s 8192, backward 2.391 ms -> 2.900 ms
  deterministic, x1.21), which applies only where TE runs FA3;
- sets CUBLAS_WORKSPACE_CONFIG=:4096:8 and torch.use_deterministic_algorithms(True): cuBLAS GEMMs keep
  their algorithms (the workspace setting only fixes the workspace per stream); deterministic torch
  kernels for scatter/index-add ops (MoE token permutation's scatter-add, embedding backward) are not
  timed differently (no public figure either).
"""

from __future__ import annotations

import dataclasses

from echo_tune.identity_cache import IdentityCache

_RING_PROFILES = IdentityCache(limit=64)

NOTE = ("deterministic mode: NCCL ring collectives and TE's deterministic attention backend choice modelled; "
        "a deterministic attention backward kernel's own slowdown is not (cuDNN on Hopper: none per TE; "
        "FlashAttention-3: x1.21 on H100, flash-attention PR #1893)")


def deterministic_attention_model(model, parallel):
    """The model as its attention runs: attention sinks under deterministic mode run unfused."""
    if parallel.deterministic_mode and model.softmax_type != "vanilla" and model.flash_attention:
        return model.replace(use_flash_attn=None, attention_backend="unfused")
    return model


def ring_only_profile(profile, parallel):
    """The profile with NCCL's tree disabled (NCCL_ALGO=Ring) under deterministic mode (cached)."""
    if not parallel.deterministic_mode:
        return profile
    return _RING_PROFILES.get((profile,), (), lambda: dataclasses.replace(profile, nccl_ring_only=True))
