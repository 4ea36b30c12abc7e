"""Closed-form FLOP counts, used for MFU and as a cross-check of the traced workload."""

from __future__ import annotations

from echo_tune.config.model import ModelSpec


def layer_matmul_params(model: ModelSpec) -> int:
    """Weights of one layer that take part in matrix multiplies (no norms, no biases)."""
    h, d, a, g, f = model.hidden_size, model.head_dim, model.num_attention_heads, model.query_groups, model.ffn_size
    return h * (a + 2 * g) * d + a * d * h + h * f * (3 if model.swiglu else 2)


def model_flops_per_step(model: ModelSpec, global_batch_size: int) -> float:
    """Model FLOPs of one step (forward + backward, no recompute), Megatron-Core's convention.

    3 x forward, forward = 2 x matmul weights x tokens + the attention score and context matmuls
    (4 s^2 a d per sequence per layer, counted dense as Megatron does) + the logits (2 h V per token).
    For ffn = 4h and MHA this equals 72 B s L h^2 (1 + s/(6h) + V/(12 h L)).
    """
    s, L = model.seq_length, model.num_layers
    per_sequence = L * (2 * s * layer_matmul_params(model) + 4 * s * s * model.num_attention_heads * model.head_dim)
    per_sequence += 2 * s * model.hidden_size * model.padded_vocab_size()
    return 3.0 * global_batch_size * per_sequence


def hardware_flops_per_step(model: ModelSpec, global_batch_size: int, recompute: str | None) -> float:
    """FLOPs including a recomputed forward (Narayanan et al. 2021 eq. 3 convention with full recompute)."""
    base = model_flops_per_step(model, global_batch_size)
    if recompute == "full":
        logits = 6.0 * global_batch_size * model.seq_length * model.hidden_size * model.padded_vocab_size()
        return base + (base - logits) / 3.0
    return base
