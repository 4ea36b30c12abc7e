"""The ex-situ tracer against closed forms: FLOPs, activation memory (Korthikanti et al. 2022), collectives."""

from __future__ import annotations

import time

import pytest

from echo_tune.config import load_model
from echo_tune.errors import ConfigError
from echo_tune.workload import OP_KINDS, trace_embedding, trace_layer, trace_output
from echo_tune.workload.recording.recorder import METADATA

GPT3 = load_model("gpt3-175b")  # h=12288, a=96, s=2048, ffn=4h, GeLU, LayerNorm, unfused attention
B = 2  # micro-batch size used throughout
REGIONS = {"input_norm", "qkv", "core_attention", "attention_proj", "attention_residual", "mlp_norm", "mlp",
           "mlp_residual", "embedding", "output"}


def gemm_flops(ops, region=None) -> float:
    return sum(op.flops for op in ops if op.kind == "gemm" and region in (None, op.region))


def collectives(ops) -> list[tuple[str, str, int]]:
    return [(op.collective, op.group, op.size_bytes) for op in ops if op.kind == "collective"]


# --- FLOPs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tp", [1, 8])
def test_layer_gemm_flops_match_closed_form(tp):
    """Forward GEMMs of a GPT layer: (24 b s h^2 + 4 b s^2 h) / t; backward does twice that."""
    trace = trace_layer(GPT3, tensor_model_parallel_size=tp, micro_batch_size=B)
    h, s = GPT3.hidden_size, GPT3.seq_length
    expected = (24 * B * s * h * h + 4 * B * s * s * h) / tp
    assert gemm_flops(trace.forward) == expected
    assert gemm_flops(trace.backward) == 2 * expected
    assert gemm_flops(trace.forward, "core_attention") == 4 * B * s * s * h / tp


def test_output_layer_gemm_flops():
    trace = trace_output(GPT3, tensor_model_parallel_size=8, micro_batch_size=B)
    v = GPT3.padded_vocab_size(8)
    assert gemm_flops(trace.forward) == 2 * B * GPT3.seq_length * GPT3.hidden_size * v / 8
    assert gemm_flops(trace.backward) == 2 * gemm_flops(trace.forward)


def test_whole_model_is_six_n_plus_attention():
    """(fwd + bwd) GEMM FLOPs per token = 6 * (GEMM parameters) + 12 L s h (the attention scores).

    GEMM parameters are 12 h^2 per layer plus the h x V output layer; the rest of N (biases, norms,
    position embeddings: ~2e-4 of it) does no GEMM work, hence the 1e-3 tolerance against 6N.
    """
    layer = trace_layer(GPT3, tensor_model_parallel_size=1)
    out = trace_output(GPT3, tensor_model_parallel_size=1)
    tokens, (h, s, n_layers) = GPT3.seq_length, (GPT3.hidden_size, GPT3.seq_length, GPT3.num_layers)
    per_token = (n_layers * (gemm_flops(layer.forward) + gemm_flops(layer.backward))
                 + gemm_flops(out.forward) + gemm_flops(out.backward)) / tokens
    v = GPT3.padded_vocab_size(1)
    assert per_token == 6 * (n_layers * 12 * h * h + h * v) + 12 * n_layers * s * h
    assert per_token - 12 * n_layers * s * h == pytest.approx(6 * GPT3.num_params(), rel=1e-3)


def test_gqa_projects_fewer_key_value_flops():
    mha = load_model("llama2-70b").replace(num_query_groups=64)
    gqa = load_model("llama2-70b")  # 8 query groups
    h, s, d, a, g = gqa.hidden_size, gqa.seq_length, gqa.head_dim, gqa.num_attention_heads, gqa.query_groups
    traces = [trace_layer(m, tensor_model_parallel_size=8) for m in (mha, gqa)]
    qkv = [gemm_flops(t.forward, "qkv") for t in traces]
    assert qkv[0] == 2 * s * h * (a + 2 * a) * d / 8
    assert qkv[1] == 2 * s * h * (a + 2 * g) * d / 8
    assert traces[1].param_count < traces[0].param_count


def test_swiglu_mlp():
    llama = load_model("llama2-7b")
    trace = trace_layer(llama, tensor_model_parallel_size=2)
    h, s, f = llama.hidden_size, llama.seq_length, llama.ffn_size
    assert gemm_flops(trace.forward, "mlp") == 2 * s * h * (2 * f + f) / 2
    names = [op.name for op in trace.forward if op.region == "mlp"]
    assert "echo_tune.swiglu" in names and "aten.gelu" not in names
    # The fused SwiGLU keeps its input (2f/t) and fc2 its output (f/t); fc1 keeps the norm output.
    assert trace.activation_bytes_by_region["mlp"] == 2 * s * (h + 2 * f // 2 + f // 2)
    assert trace.param_count == llama.layer_params() // 2 + 2 * h // 2  # norms are not sharded


def test_flash_attention_is_one_fused_op_each_way():
    model = GPT3.replace(use_flash_attn=True)
    trace = trace_layer(model, tensor_model_parallel_size=8, micro_batch_size=B)
    fwd = [op for op in trace.forward if op.region == "core_attention"]
    bwd = [op for op in trace.backward if op.region == "core_attention"]
    assert [op.kind for op in fwd] == ["attention"] and [op.kind for op in bwd] == ["attention"]
    h, s = GPT3.hidden_size, GPT3.seq_length
    assert fwd[0].flops == 4 * B * s * s * h / 8 / 2  # causal: half of the full 4 b s^2 h
    assert bwd[0].flops == 2.5 * fwd[0].flops


# --- activation memory: Korthikanti et al. 2022 (arXiv 2205.05198), Table 2 -------------------------

def korthikanti(model, tp, sp, b, flash=False) -> int:
    """Per-layer activation bytes of Table 2 (16-bit activations, 1-byte dropout masks)."""
    s, h, a = model.seq_length, model.hidden_size, model.num_attention_heads
    scores = 0 if flash else 5 * a * s * s * b // tp
    if sp:
        return s * b * h * 34 // tp + scores
    return s * b * h * (10 + 24 // tp) + scores


@pytest.mark.parametrize("tp,sp", [(1, False), (8, False), (8, True)])
@pytest.mark.parametrize("flash", [False, True])
def test_activation_bytes_match_korthikanti(tp, sp, flash):
    """Traced bytes are Table 2 plus two things the paper leaves out, exactly (tolerance 0 bytes).

    - Each of the two LayerNorms keeps fp32 mean and rstd, [s, b] each: 2 * 2 * 4 * s * b bytes, on
      the sequence shard under SP (Table 2 counts only the LayerNorm input).
    - Flash attention (use_flash_attn) drops the 5as/h term: it keeps no s x s matrix, only q, k, v
      (the QKV output, already counted), its output (the projection input, already counted) and the
      fp32 logsumexp [b, a/t, s]: 4 * a * s * b / t bytes.
    """
    model = GPT3.replace(use_flash_attn=flash)
    s, a = model.seq_length, model.num_attention_heads
    trace = trace_layer(model, tensor_model_parallel_size=tp, sequence_parallel=sp, micro_batch_size=B)
    norm_stats = 16 * s * B // (tp if sp else 1)
    logsumexp = 4 * a * s * B // tp if flash else 0
    assert trace.activation_bytes == korthikanti(model, tp, sp, B, flash) + norm_stats + logsumexp
    assert trace.activation_bytes == sum(trace.activation_bytes_by_region.values())


@pytest.mark.parametrize("tp,sp", [(1, False), (8, False), (8, True)])
def test_selective_recompute_frees_exactly_the_score_terms(tp, sp):
    """Recomputing core attention frees its internal tensors: 5as^2b/t (Korthikanti section 5).

    q, k, v (the QKV output) and the context (the projection input) stay: they cross a region boundary.
    With flash attention only the logsumexp is internal.
    """
    s, a = GPT3.seq_length, GPT3.num_attention_heads
    trace = trace_layer(GPT3, tensor_model_parallel_size=tp, sequence_parallel=sp, micro_batch_size=B)
    assert trace.region_internal_bytes["core_attention"] == 5 * a * s * s * B // tp
    kept = trace.activation_bytes - trace.region_internal_bytes["core_attention"]
    assert kept == korthikanti(GPT3, tp, sp, B, flash=True) + 16 * s * B // (tp if sp else 1)
    flash = trace_layer(GPT3.replace(use_flash_attn=True), tensor_model_parallel_size=tp, sequence_parallel=sp,
                        micro_batch_size=B)
    assert flash.region_internal_bytes["core_attention"] == 4 * a * s * B // tp


def test_no_attention_dropout_keeps_only_softmax_output():
    model = GPT3.replace(attention_dropout=0.0)
    s, a, h, tp = model.seq_length, model.num_attention_heads, model.hidden_size, 8
    trace = trace_layer(model, tensor_model_parallel_size=tp)
    qkv_out = 6 * s * h // tp
    assert trace.activation_bytes_by_region["core_attention"] == qkv_out + 2 * a * s * s // tp


# --- collectives ----------------------------------------------------------------------------------

def test_tensor_parallel_collectives_without_sp():
    trace = trace_layer(GPT3, tensor_model_parallel_size=8, micro_batch_size=B)
    full = 2 * GPT3.seq_length * B * GPT3.hidden_size
    assert collectives(trace.forward) == [("all_reduce", "tp", full)] * 2  # after proj and fc2
    assert collectives(trace.backward) == [("all_reduce", "tp", full)] * 2  # fc1 and QKV input grads
    assert [op.region for op in trace.backward if op.kind == "collective"] == ["mlp", "qkv"]


def test_tensor_parallel_collectives_with_sp():
    """SP: all-gather before each column-parallel linear, reduce-scatter after each row-parallel one.

    Backward: the row-parallel duals (all-gather), and per column-parallel linear the re-gather of its
    saved input shard (for the weight gradient) and the reduce-scatter of its input gradient.
    """
    trace = trace_layer(GPT3, tensor_model_parallel_size=8, sequence_parallel=True, micro_batch_size=B)
    full = 2 * GPT3.seq_length * B * GPT3.hidden_size  # gathered output / full input: nccl-tests sizes
    gather, scatter = ("all_gather", "tp", full), ("reduce_scatter", "tp", full)
    assert collectives(trace.forward) == [gather, scatter, gather, scatter]
    assert collectives(trace.backward) == [gather, gather, scatter, gather, gather, scatter]


def test_no_collectives_without_parallelism():
    trace = trace_layer(GPT3, tensor_model_parallel_size=1, sequence_parallel=True)
    assert not collectives(trace.forward + trace.backward)
    assert trace is trace_layer(GPT3, tensor_model_parallel_size=1)  # SP is off at TP=1, as in Megatron


def test_cross_entropy_and_embedding_collectives():
    s, h, tp = GPT3.seq_length, GPT3.hidden_size, 8
    out = trace_output(GPT3, tensor_model_parallel_size=tp, micro_batch_size=B)
    assert collectives(out.forward) == [("all_reduce", "tp", 4 * s * B)] * 3
    assert collectives(out.backward) == [("all_reduce", "tp", 2 * s * B * h)]
    emb = trace_embedding(GPT3, tensor_model_parallel_size=tp, sequence_parallel=True, micro_batch_size=B)
    assert collectives(emb.forward) == [("reduce_scatter", "tp", 2 * s * B * h)]
    assert collectives(emb.backward) == [("all_gather", "tp", 2 * s * B * h)]
    assert emb.output_bytes == 2 * s * B * h // tp
    assert emb.param_count == GPT3.padded_vocab_size(tp) // tp * h + s * h  # word rows sharded, positions not
    assert out.tied_param_count == GPT3.padded_vocab_size(tp) * h // tp


def test_context_parallel_ring_attention():
    model, tp, cp = load_model("llama3-8b"), 2, 4
    s, b, g, d = model.seq_length, 1, model.query_groups, model.head_dim
    trace = trace_layer(model, tensor_model_parallel_size=tp, context_parallel_size=cp)
    kv_chunk = 2 * (2 * (s // cp) * b * (g // tp) * d)  # K and V of this rank, bf16
    ring = [c for c in collectives(trace.forward) if c[1] == "cp"]
    assert ring == [("send_recv", "cp", kv_chunk)] * (cp - 1)
    ring_bwd = [c for c in collectives(trace.backward) if c[1] == "cp"]
    assert ring_bwd == [("send_recv", "cp", kv_chunk)] * (2 * (cp - 1))  # K/V, then dK/dV
    full_causal = 4 * b * model.num_attention_heads // tp * s * s * d / 2
    attention = sum(op.flops for op in trace.forward if op.kind == "attention")
    assert attention == full_causal / cp
    assert trace.input_bytes == 2 * (s // cp) * b * model.hidden_size


# --- structure, caching, speed ----------------------------------------------------------------------

@pytest.mark.parametrize("trace_fn", [trace_layer, trace_embedding, trace_output])
def test_ops_are_well_formed(trace_fn):
    trace = trace_fn(load_model("llama3-8b"), tensor_model_parallel_size=4, sequence_parallel=True,
                     context_parallel_size=2)
    metadata = {str(packet) for packet in METADATA}
    for phase, ops in (("fwd", trace.forward), ("bwd", trace.backward)):
        for op in ops:
            assert op.phase == phase and op.kind in OP_KINDS and op.region in REGIONS
            assert op.name not in metadata
            assert (op.gemm_mnk is not None) == (op.kind == "gemm")
            assert op.kind == "collective" or op.bytes > 0


def test_backward_ops_carry_their_forward_region():
    trace = trace_layer(GPT3, tensor_model_parallel_size=8)
    for region in ("qkv", "core_attention", "attention_proj", "mlp"):
        assert gemm_flops(trace.backward, region) == 2 * gemm_flops(trace.forward, region)
    assert [op.name for op in trace.backward if op.region == "input_norm"][0] == "aten.native_layer_norm_backward"


def test_cache_returns_same_object_across_irrelevant_fields():
    first = trace_layer(GPT3, tensor_model_parallel_size=4)
    assert trace_layer(GPT3, tensor_model_parallel_size=4) is first
    assert trace_layer(GPT3.replace(name="x", num_layers=3, vocab_size=1000), tensor_model_parallel_size=4) is first
    assert trace_layer(GPT3.replace(hidden_dropout=0.2), tensor_model_parallel_size=4) is first
    assert trace_layer(GPT3, tensor_model_parallel_size=4, micro_batch_size=2) is not first


def test_layer_params_and_io_bytes():
    trace = trace_layer(GPT3, tensor_model_parallel_size=8, sequence_parallel=True)
    h = GPT3.hidden_size
    sharded = 12 * h * h + 3 * h + 4 * h  # QKV and fc1 weights and biases, proj and fc2 weights
    replicated = 2 * h + 4 * h  # proj and fc2 biases (added after the reduction), two LayerNorms
    assert trace.param_count == sharded // 8 + replicated == GPT3.layer_params() - 7 * (sharded // 8)
    assert trace.input_bytes == trace.output_bytes == 2 * GPT3.seq_length * h // 8


def test_uncached_trace_is_fast():
    trace_layer(GPT3, tensor_model_parallel_size=2)  # warm up torch's lazy imports
    start = time.perf_counter()
    trace_layer(GPT3.replace(seq_length=4096), tensor_model_parallel_size=2, micro_batch_size=3)
    assert time.perf_counter() - start < 1.0


def test_bad_split_is_a_config_error():
    with pytest.raises(ConfigError, match="num_attention_heads % tensor_model_parallel_size"):
        trace_layer(GPT3, tensor_model_parallel_size=7)
