"""Model FLOPs of one step, as Megatron-LM counts them (for MFU and model TFLOP/s per GPU).

A port of ``num_floating_point_operations`` in megatron/training/training.py (NVIDIA/Megatron-LM commit
d98e8a64ddf3), standard-transformer branch with the BSHD defaults (every sample seq_length tokens):

- 3 (forward, wgrad, dgrad) x 2 (multiply-add) x tokens x per-token GEMM weights, where the weights are
  the attention projections (MHA/GQA with ``kv_channels``, or MLA's low-rank projections), the dense
  MLPs (3 h ffn with SwiGLU, else 2 h ffn), the routed experts of the MoE layers (top-k x moe_ffn) and
  their shared expert, the MTP norms and projections, and the logits over the padded vocabulary
  (multiple of make_vocab_size_divisible_by x TP) once per output head (1 + MTP layers); with
  ``--attention-output-gate`` also the QKV projection's gate columns (h x query projection size);
- core attention: 3 x 2 x batch x s^2 x (query projection size) / 2 (causal mask) x 2 (QK^T and PV); for
  MLA, heads x ((qk_head_dim + qk_pos_emb_head_dim) + v_head_dim) / 2.
Megatron's formula has no router term (the [h, E] router GEMM is not counted), nor norms or softmax.
With the gated delta net (``--experimental-attention-variant gdn``) its layers count, in place of self-attention's
projections and core term, h x in_proj + conv kernel x (2 qk + v) + 4 value heads x d_v^2 (KK^T, VK^T,
S(a(I - bKK^T)), SQ) + h x v per token (training.py ``linear_self_attn_term``).
"""

from __future__ import annotations

from echo_tune.config.specs.model import ModelSpec


def _attention_terms(model: ModelSpec) -> tuple[float, float]:
    """(token-linear GEMM weights of one attention block, per-token-pair core term) before the 3 x 2."""
    h, a = model.hidden_size, model.num_attention_heads
    if model.multi_latent_attention:
        qk = model.qk_head_dim + model.qk_pos_emb_head_dim
        q_term = h * a * qk if model.q_lora_rank is None else model.q_lora_rank * (h + a * qk + 1)
        linear = (q_term + model.kv_lora_rank * (h + a * (model.qk_head_dim + model.v_head_dim) + 1)
                  + h * model.qk_pos_emb_head_dim + a * model.v_head_dim * h)
        return linear, a * qk / 2 + a * model.v_head_dim / 2
    d = model.kv_channels or h // a
    query, kv = d * a, d * model.query_groups
    gate = query if model.attention_output_gate else 0  # training.py gate_projection_size
    return h * (query + 2 * kv + gate) + query * h, query / 2 * 2


def model_flops_per_step(model: ModelSpec, global_batch_size: int, tensor_model_parallel_size: int = 1) -> float:
    """Megatron-LM's ``num_floating_point_operations(args, global_batch_size)`` for this model."""
    h, s = model.hidden_size, model.seq_length
    pattern = model.moe_pattern
    num_moe = sum(pattern)
    num_dense = model.num_layers - num_moe
    mtp = model.mtp_num_layers or 0
    if mtp:  # MTP layers repeat the last layer's kind
        num_moe, num_dense = num_moe + pattern[-1] * mtp, num_dense + (1 - pattern[-1]) * mtp
    num_layers = model.num_layers + mtp
    ffn_factor = 3 if model.swiglu else 2
    routed = model.moe_ffn_size * model.moe_router_topk * ffn_factor if model.is_moe else 0
    shared = (model.moe_shared_expert_intermediate_size or 0) * ffn_factor
    linear, core = _attention_terms(model)
    num_gdn = sum(model.linear_attention_pattern)
    num_attention = num_layers - num_gdn
    vocab = model.padded_vocab_size(tensor_model_parallel_size)
    per_token = 6 * (h * (model.ffn_size * ffn_factor * num_dense + (routed + shared) * num_moe)
                     + linear * num_attention + _gdn_term(model) * num_gdn + mtp * (3 * h + 2 * h * h)
                     + h * vocab * (mtp + 1))
    tokens = global_batch_size * s
    return float(tokens * per_token + global_batch_size * s * s * 6 * core * num_attention)


def _gdn_term(model: ModelSpec) -> float:
    """Per-token weights of one gated-delta-net layer before the 3 x 2 (training.py ``linear_self_attn_term``)."""
    if not model.linear_attention:
        return 0.0
    qk = model.linear_key_head_dim * model.linear_num_key_heads
    v = model.linear_value_head_dim * model.linear_num_value_heads
    in_proj = 2 * qk + 2 * v + 2 * model.linear_num_value_heads
    return (model.hidden_size * in_proj + model.linear_conv_kernel_dim * (2 * qk + v)
            + model.linear_num_value_heads * model.linear_value_head_dim ** 2 * 4 + model.hidden_size * v)


def hardware_flops_per_step(model: ModelSpec, global_batch_size: int, recompute: str | None,
                            tensor_model_parallel_size: int = 1) -> float:
    """FLOPs including a recomputed forward (Narayanan et al. 2021 eq. 3 convention with full recompute)."""
    base = model_flops_per_step(model, global_batch_size, tensor_model_parallel_size)
    if recompute == "full":
        logits = 6.0 * global_batch_size * model.seq_length * model.hidden_size * model.padded_vocab_size(
            tensor_model_parallel_size) * (1 + (model.mtp_num_layers or 0))
        return base + (base - logits) / 3.0
    return base
