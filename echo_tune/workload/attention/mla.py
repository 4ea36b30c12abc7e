"""Multi-latent attention (DeepSeek-V2/V3) as Megatron-Core shards it, on ``meta``.

megatron/core/transformer/multi_latent_attention.py (``MLASelfAttention``), NVIDIA/Megatron-LM commit
d98e8a64ddf3:

- down projections, replicated over TP ("duplicated" TELinears, no TP communication): the query to
  ``q_lora_rank`` (or, without it, a TP-sharded query projection), and the key/value to ``kv_lora_rank`` plus
  the shared RoPE key part ``qk_pos_emb_head_dim``; traced fused into one GEMM (Megatron's
  ``--mla-down-proj-fusion`` shape, same FLOPs). Each rank projects the tokens it holds: under sequence
  parallelism its sequence shard (``_qkv_down_projection`` on ``hidden_states`` [s/TP, b, h]), and the RoPE key
  part is then all-gathered over TP (``gather_from_sequence_parallel_region``, reduce-scattered backward);
- RMSNorm on the query and key/value latents (``--qk-layernorm``), on the rank's tokens;
- up projections (the "mla_up_proj" region), column-parallel over TP: latent -> heads x (qk + rope) and
  latent -> heads x (qk + v); under sequence parallelism each all-gathers its latent first (q_lora_rank and
  kv_lora_rank wide, not the hidden size) and reduce-scatters its input gradient;
- RoPE on the rope parts; the key's rope part is shared by the heads (expanded). Traced in "mla_up_proj" with
  the up projections: Megatron's ``--recompute-modules mla_up_proj`` checkpoints both
  (``qkv_up_proj_and_rope_apply`` under ``CheckpointWithoutOutput``), discarding query, key and value;
- core attention with query/key size qk + rope and value size v; output projection heads x v -> h.

Backward communication: under sequence parallelism the up projections reduce-scatter the latent gradients
(summing the TP ranks' partial sums over their heads) and the RoPE key part's gather reduce-scatters its
gradient; without it the up projections all-reduce the latent gradient over TP.

Not traced: with sequence parallelism Megatron marks the duplicated down-projection weights
``sequence_parallel`` (transformer_engine.py ``TELinear``), so their gradients are all-reduced over TP once a
step with the norm weights' (``finalize_model_grads``): (q_lora_rank + kv_lora_rank + rope) x hidden per layer,
about 60 MB of fp32 gradient per DeepSeek-V3 layer over NVLink, well under 0.1% of its steps.
"""

from __future__ import annotations

import torch

from echo_tune.workload.recording.comm import _ParallelLinear, column_parallel_linear, gather_from_sp
from echo_tune.workload.recording.context import in_region, in_subregion, tag_backward


def mla_params(shard) -> dict[str, torch.Tensor]:
    m, heads = shard.model, shard.heads
    qk, pos, v = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
    q_latent = m.q_lora_rank or 0
    params = {"down": shard.tensor(q_latent + m.kv_lora_rank + pos, m.hidden_size, grad=True),
              "kv_up": shard.tensor(heads * (qk + v), m.kv_lora_rank, grad=True)}
    if q_latent:
        params["q_up"] = shard.tensor(heads * (qk + pos), q_latent, grad=True)
    else:
        params["q_proj"] = shard.tensor(heads * (qk + pos), m.hidden_size, grad=True)
    if m.qk_layernorm:
        params["kv_norm"] = shard.tensor(m.kv_lora_rank, grad=True)
        if q_latent:
            params["q_norm"] = shard.tensor(q_latent, grad=True)
    return params


def _norm(x, weight):
    if weight is None:
        return x
    return torch.ops.echo_tune.rms_norm(x, weight, 1e-6)[0]


def _down(x, params, shard):
    m = shard.model
    latent = _ParallelLinear.apply(x, params["down"], None, 1, False, False)  # duplicated: the rank's tokens
    q_latent = m.q_lora_rank or 0
    q_c, kv_c, k_pos = torch.split(latent, [q_latent, m.kv_lora_rank, m.qk_pos_emb_head_dim], dim=-1)
    if shard.sequence_parallel and shard.tp > 1:  # bf16, not TE's: a sub-region outside the FP8 linears
        tag_backward(k_pos, "qkv")  # the split and the down projection's backward are the region's, not the gather's
        k_pos = in_subregion("k_pos_gather", gather_from_sp, k_pos, shard.tp)
    q_c = _norm(q_c, params.get("q_norm")) if q_latent else None
    return q_c, _norm(kv_c, params.get("kv_norm")), k_pos


def _up_projections(x, q_c, kv_c, k_pos, params, shard, rope_freqs):
    """The up projections and RoPE: q, k [s, b, heads, qk + rope] and v [s, b, heads, v]."""
    m, heads, tp, sp = shard.model, shard.heads, shard.tp, shard.sequence_parallel
    qk, pos, v = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
    # column-parallel over TP (see the module docstring for their communication)
    if q_c is not None:
        q = column_parallel_linear(q_c, params["q_up"], None, tp, sp)
    else:
        q = column_parallel_linear(x, params["q_proj"], None, tp, sp)
    kv = column_parallel_linear(kv_c, params["kv_up"], None, tp, sp)
    s, b = kv.shape[:2]
    q = q.view(s, b, heads, qk + pos)
    k_nope, value = torch.split(kv.view(s, b, heads, qk + v), [qk, v], dim=-1)
    q_nope, q_pos = torch.split(q, [qk, pos], dim=-1)
    if rope_freqs is not None:
        q_pos = torch.ops.echo_tune.rope(q_pos, rope_freqs)
        k_pos = torch.ops.echo_tune.rope(k_pos.view(s, b, 1, -1), rope_freqs)
    k_pos = k_pos.reshape(s, b, 1, -1).expand(s, b, heads, pos)
    return torch.cat([q_nope, q_pos], dim=-1), torch.cat([k_nope, k_pos], dim=-1), value


def mla_qkv(x: torch.Tensor, params: dict, shard) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k [s, b, heads, qk + rope] and v [s, b, heads, v] for core attention."""
    p = params["mla"]
    q_c, kv_c, k_pos = in_region("qkv", _down, x, p, shard)
    freqs = params["buffers"]["rope_freqs"] if "buffers" in params else None
    return in_region("mla_up_proj", _up_projections, x, q_c, kv_c, k_pos, p, shard, freqs)
