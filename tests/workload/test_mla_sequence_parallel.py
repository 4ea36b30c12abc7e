"""Multi-latent attention under sequence parallelism as Megatron-Core runs it (multi_latent_attention.py,
d98e8a64ddf3): the duplicated down projection on the rank's sequence shard (no gather of the hidden states),
the latents gathered by the up projections, the RoPE key part gathered apart."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.workload.tracer import trace_layer

MODEL = et.load_model("deepseek-v2-lite").replace(seq_length=4096)


def _tp_collectives(trace, phase):
    ops = trace.forward if phase == "fwd" else trace.backward
    return sorted((op.collective, op.region + ("/" + op.subregion if op.subregion else ""), op.size_bytes)
                  for op in ops if op.kind == "collective" and op.group == "tp" and op.region in ("qkv", "mla_up_proj"))


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_gathers_the_latents_not_the_hidden_states(tp):
    m = MODEL
    s, bf16 = m.seq_length, 2
    trace = trace_layer(m, tensor_model_parallel_size=tp, sequence_parallel=True)
    q_latent = m.q_lora_rank or 0
    assert q_latent == 0  # DeepSeek-V2-Lite projects the query from the hidden states (column-parallel, gathered)
    forward = _tp_collectives(trace, "fwd")
    assert forward == sorted([
        ("all_gather", "qkv/k_pos_gather", s * m.qk_pos_emb_head_dim * bf16),
        ("all_gather", "mla_up_proj", s * m.hidden_size * bf16),      # linear_q_proj's input (no q_lora_rank)
        ("all_gather", "mla_up_proj", s * m.kv_lora_rank * bf16),     # linear_kv_up_proj's latent
    ])
    backward = _tp_collectives(trace, "bwd")
    assert ("reduce_scatter", "qkv/k_pos_gather", s * m.qk_pos_emb_head_dim * bf16) in backward
    assert ("reduce_scatter", "mla_up_proj", s * m.kv_lora_rank * bf16) in backward
    assert not any(region == "qkv" for _, region, _ in backward)  # the duplicated down projection: local


def test_the_down_projection_runs_on_the_ranks_tokens():
    """1/TP of the down projection's FLOPs per rank under sequence parallelism (each rank its own tokens);
    the whole sequence without it (the hidden states are replicated)."""
    def down_flops(trace):
        return sum(op.flops for op in trace.forward if op.kind == "gemm" and op.region == "qkv")
    full = down_flops(trace_layer(MODEL, tensor_model_parallel_size=4, sequence_parallel=False))
    assert down_flops(trace_layer(MODEL, tensor_model_parallel_size=4, sequence_parallel=True)) == \
        pytest.approx(full / 4)
    assert down_flops(trace_layer(MODEL, tensor_model_parallel_size=1)) == pytest.approx(full)


def test_with_a_query_latent_both_latents_are_gathered():
    m = et.load_model("deepseek-v3").replace(seq_length=4096)
    s, bf16 = m.seq_length, 2
    forward = _tp_collectives(trace_layer(m, tensor_model_parallel_size=2, sequence_parallel=True), "fwd")
    assert sorted(size for op, region, size in forward if region == "mla_up_proj") == \
        sorted([s * m.q_lora_rank * bf16, s * m.kv_lora_rank * bf16])
    assert all(size < s * m.hidden_size * bf16 / 2 for _, _, size in forward)


def test_only_the_gather_is_tagged_as_the_rope_key_gather():
    """The sub-region holds the gather alone: the down projection's backward GEMMs stay in "qkv" (FP8 under
    --fp8-format, FP8_REGIONS), and the blocking reduce-scatter pairs with no GEMM (cost/tp_overlap.async_pairs)."""
    from echo_tune.cost.kernels.fp8 import is_fp8_gemm
    from echo_tune.cost.collectives.tp_overlap import async_pairs

    m = et.load_model("deepseek-v3").replace(seq_length=4096)
    trace = trace_layer(m, tensor_model_parallel_size=2, sequence_parallel=True)
    tagged = [op for op in trace.forward + trace.backward if op.subregion == "k_pos_gather"]
    assert tagged and all(op.kind == "collective" for op in tagged)
    down = [op for op in trace.backward if op.kind == "gemm" and op.region == "qkv"]
    assert len(down) == 2 and all(is_fp8_gemm(op) for op in down)  # dgrad and wgrad of the down projection
    backward = trace.backward
    paired = {backward[c].subregion for c, _ in async_pairs(backward)}
    assert "k_pos_gather" not in paired and paired  # the up projections' own collectives still pair


def test_up_projection_recompute_discards_query_key_and_value():
    """Megatron's --recompute-modules mla_up_proj checkpoints the up projections and RoPE
    (qkv_up_proj_and_rope_apply) and discards their outputs: the region creates the roped query and key that
    core attention saves (they were created in "qkv", so the recompute freed nothing)."""
    m = MODEL
    trace = trace_layer(m, tensor_model_parallel_size=1)
    heads, s, bf16 = m.num_attention_heads, m.seq_length, 2
    assert trace.region_created_bytes["mla_up_proj"] >= 2 * s * heads * (m.qk_head_dim + m.qk_pos_emb_head_dim) * bf16


def test_without_sequence_parallelism_the_latent_gradients_are_all_reduced():
    """TP > 1 without SP: the hidden states are replicated, nothing is gathered forward, and each up projection
    all-reduces its latent's gradient over TP (Megatron's copy_to_tensor_model_parallel_region backward)."""
    m = MODEL
    trace = trace_layer(m, tensor_model_parallel_size=2, sequence_parallel=False)
    assert _tp_collectives(trace, "fwd") == []
    backward = _tp_collectives(trace, "bwd")
    s, bf16 = m.seq_length, 2
    assert ("all_reduce", "mla_up_proj", s * m.kv_lora_rank * bf16) in backward
    assert ("all_reduce", "mla_up_proj", s * m.hidden_size * bf16) in backward  # linear_q_proj's input gradient
    assert not any(region.startswith("qkv") for _, region, _ in backward)


def test_with_context_parallelism_the_gathers_cover_the_ranks_sequence_chunk():
    m = MODEL
    s, bf16 = m.seq_length // 2, 2
    forward = _tp_collectives(trace_layer(m, tensor_model_parallel_size=2, context_parallel_size=2,
                                          sequence_parallel=True), "fwd")
    assert ("all_gather", "qkv/k_pos_gather", s * m.qk_pos_emb_head_dim * bf16) in forward
    assert ("all_gather", "mla_up_proj", s * m.kv_lora_rank * bf16) in forward
