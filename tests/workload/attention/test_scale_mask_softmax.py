"""workload/attention/scale_mask_softmax.py and the local spec's layer (--transformer-impl local), against the TE spec.

Expected values are worked out by hand from Megatron-LM d98e8a64ddf3 (core/transformer/dot_product_attention.py,
core/fusions/fused_softmax.py) for a tiny model: s = 128, b = 2, 4 heads of d = 16, one TP rank, bf16.
E = b * heads * s * s = 131072 attention scores.
"""

import pytest

from echo_tune.config.specs.model import ModelSpec
from echo_tune.workload.attention.scale_mask_softmax import batches_per_block, fused_kernel_available
from echo_tune.workload.tracer import _canonical, trace_layer, trace_moe_layer

S, B, H, HEADS = 128, 2, 64, 4
E = B * HEADS * S * S
TE = ModelSpec(num_layers=2, hidden_size=H, num_attention_heads=HEADS, seq_length=S, vocab_size=1000,
               make_vocab_size_divisible_by=8, hidden_dropout=0.0, attention_dropout=0.1, add_bias_linear=False)
LOCAL = TE.replace(transformer_impl="local")


def _layer(model, precision="bf16"):
    return trace_layer(model, tensor_model_parallel_size=1, micro_batch_size=B, precision=precision)


def _names(trace, region="core_attention"):
    return [op.name for op in trace.forward if op.region == region]


@pytest.mark.parametrize("sk,expected", [(1024, 4), (4096, 4), (256, 4), (128, 8), (64, 8), (17, 8)])
def test_batches_per_block_as_apex_computes_it(sk, expected):
    # 128 threads; warp = min(32, next pow2 of sk); two rows per warp when next pow2 <= 128
    assert batches_per_block(sk) == expected


def test_fused_kernel_availability_rules():
    ok = dict(fusion=True, precision="bf16", batches=32, sq=1024, sk=1024)
    assert fused_kernel_available(**ok)
    for bad in (dict(fusion=False), dict(precision="fp32"), dict(sq=8192, sk=8192), dict(sq=16, sk=16),
                dict(batches=30), dict(sq=1022, sk=1022)):
        assert not fused_kernel_available(**{**ok, **bad})
    assert not fused_kernel_available(**{**ok, "sq": 128, "sk": 128, "batches": 12})  # 12 % 8 rows per block


def test_local_attention_keeps_the_s_by_s_scores_that_flash_does_not():
    te, local = _layer(TE), _layer(LOCAL)
    assert _names(te) == ["echo_tune.flash_attn"]
    assert _names(local)[:3] == ["aten.bmm", "echo_tune.scaled_upper_triang_masked_softmax", "aten.native_dropout"]
    # kept: softmax output (2 B) + dropout mask (1 B) + dropout output (2 B) per score = 5 E = 655360;
    # flash keeps its fp32 logsumexp [b, heads, s] instead (4 * 2 * 4 * 128 = 4096); q, k, v and the
    # context feed the projections either way
    assert local.activation_bytes - te.activation_bytes == 5 * E - 4 * B * HEADS * S


def test_local_spec_ignores_the_attention_backend_and_matches_tes_unfused_path():
    local = _layer(LOCAL)
    assert _layer(LOCAL.replace(attention_backend="flash")).activation_bytes == local.activation_bytes
    te_unfused = _layer(TE.replace(attention_backend="unfused"))
    assert _names(te_unfused) == _names(local) and te_unfused.activation_bytes == local.activation_bytes


def test_no_masked_softmax_fusion_runs_torch_ops_and_keeps_the_mask():
    fused, unfused = _layer(LOCAL), _layer(LOCAL.replace(masked_softmax_fusion=False))
    assert "aten._softmax" in _names(unfused) and "aten.masked_fill_" in _names(unfused)
    # get_default_causal_mask: a fresh bool [s, s] kept by masked_fill for backward: s * s = 16384 bytes
    assert unfused.activation_bytes - fused.activation_bytes == S * S


def test_fp32_softmax_keeps_fp32_probabilities():
    fused = _layer(LOCAL)
    scaled = _layer(LOCAL.replace(masked_softmax_fusion=False, apply_query_key_layer_scaling=True))
    # softmax output in fp32 (4 B instead of 2) plus the bool mask: 2 E + s * s = 262144 + 16384
    assert scaled.activation_bytes - fused.activation_bytes == 2 * E + S * S
    assert _names(scaled).count("aten._to_copy") == 3  # scores to fp32, mask to bool, probabilities back


def test_fp32_training_cannot_use_the_fused_kernel():
    assert "echo_tune.scaled_upper_triang_masked_softmax" not in _names(_layer(LOCAL, precision="fp32"))


def test_norm_kernels_are_those_of_the_te_spec():
    # Apex FusedLayerNorm and torch >= 2.8's fused RMSNorm (WrappedTorchNorm) are one kernel each way,
    # keeping what TE's LayerNormLinear keeps (input, mean / rstd): same bytes, region by region
    for norm in ("LayerNorm", "RMSNorm"):
        te = _layer(TE.replace(normalization=norm))
        local = _layer(LOCAL.replace(normalization=norm, no_persist_layer_norm=True))
        for region in ("input_norm", "mlp_norm"):
            assert [(o.name, o.bytes) for o in local.forward + local.backward if o.region == region] == \
                   [(o.name, o.bytes) for o in te.forward + te.backward if o.region == region]


def test_local_experts_run_one_gemm_per_expert_even_with_grouped_gemm():
    moe = dict(num_experts=4, moe_router_topk=1, moe_grouped_gemm=True)
    count = lambda m, name: sum(1 for o in trace_moe_layer(m, tensor_model_parallel_size=1, micro_batch_size=B).forward
                                if o.region == "moe" and o.kind == "gemm" and o.name == name)
    assert count(TE.replace(**moe), "aten.bmm") == 2
    assert count(LOCAL.replace(**moe), "aten.bmm") == 0
    assert count(LOCAL.replace(**moe), "aten.mm") == 1 + 2 * 4  # the router, then fc1 and fc2 of 4 experts


def test_trace_cache_key_holds_the_spec_only_where_it_changes_the_trace():
    assert _canonical("layer", LOCAL) != _canonical("layer", TE)
    assert _canonical("layer", LOCAL) != _canonical("layer", LOCAL.replace(masked_softmax_fusion=False))
    assert _canonical("layer", TE) == _canonical("layer", TE.replace(masked_softmax_fusion=False))
    for piece in ("embedding", "output"):
        assert _canonical(piece, LOCAL.replace(apply_query_key_layer_scaling=True)) == _canonical(piece, TE)
