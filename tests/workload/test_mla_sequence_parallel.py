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
