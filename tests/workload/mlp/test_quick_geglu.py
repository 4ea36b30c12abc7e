"""GPT-OSS's expert MLP as Megatron-LM d98e8a64ddf3 runs it: the clamped quick-GeGLU (``--quick-geglu``,
``activation_func_clamp_value``, ``glu_linear_offset``; core/fusions/fused_bias_geglu.py) and fc2's per-expert bias
weighted by each copy's probability (moe/experts.py ``TEGroupedMLP._apply_bias``), worked by hand on a small layer."""

import pytest

from echo_tune.config.specs.model import ModelSpec
from echo_tune.errors import ConfigError
from echo_tune.workload import trace_moe_layer

S, H, E, K, F = 64, 32, 8, 2, 48
OSS = ModelSpec(num_layers=2, hidden_size=H, num_attention_heads=4, seq_length=S, vocab_size=1000,
                make_vocab_size_divisible_by=8, position_embedding_type="rope", hidden_dropout=0.0,
                attention_dropout=0.0, num_experts=E, moe_router_topk=K, moe_ffn_hidden_size=F, moe_grouped_gemm=True,
                moe_token_dispatcher_type="alltoall", moe_router_force_load_balancing=True, quick_geglu=True,
                activation_func_clamp_value=7.0, glu_linear_offset=1.0, add_bias_linear=True)


def _trace(model, ep=2):
    return trace_moe_layer(model, tensor_model_parallel_size=1, expert_model_parallel_size=ep)


def _act(trace, phase="forward"):
    return [op.name for op in getattr(trace, phase) if op.region == "moe"
            and op.subregion in ("experts", "expert_act", "expert_bias") and op.kind == "memory"]


def test_clamped_quick_geglu_runs_two_clamps_a_copy_a_host_sync_and_one_fused_kernel():
    names = _act(_trace(OSS.replace(add_bias_linear=False)))
    assert names == ["aten.clamp", "aten.clamp", "aten.cat", "echo_tune.host_scalar_to_device", "echo_tune.quick_geglu"]
    rows = S * K  # force-balanced: every rank's experts get its tokens' k copies
    cat = next(op for op in _trace(OSS.replace(add_bias_linear=False)).forward if op.name == "aten.cat"
               and op.subregion == "expert_act")
    assert cat.bytes == 2 * (rows * 2 * F * 2)  # reads both clamped halves and writes [rows, 2f] in bf16
    # without the clamp Megatron feeds fc1's output straight to the fused kernel
    assert _act(_trace(OSS.replace(add_bias_linear=False, activation_func_clamp_value=None))) == [
        "echo_tune.host_scalar_to_device", "echo_tune.quick_geglu"]


def test_fc2_bias_is_two_kernels_per_local_expert_and_a_copy():
    for ep in (1, 2, 4):
        local = E // ep
        plain = _act(_trace(OSS.replace(add_bias_linear=False), ep))
        names = _act(_trace(OSS, ep))
        extra = names[len(plain):]
        assert extra.count("aten.mul") == local and extra.count("aten.add") == local  # t + b * p per expert
        assert extra.count("aten.cat") == 1
        bias_ops = [op for op in _trace(OSS, ep).forward if op.subregion == "expert_bias"]
        assert len(bias_ops) == 2 * local + 1  # all in their own sub-region: bare PyTorch calls for the host


def test_expert_biases_are_parameters():
    # router bias [E], fc1 bias [2f] and fc2 bias [h] per expert; attention's qkv bias (a + 2g) d and proj bias h
    d = H // 4
    assert OSS.layer_params(moe=True) - OSS.replace(add_bias_linear=False).layer_params(moe=True) == (
        E * (1 + 2 * F + H) + (4 + 2 * 4) * d + H)


def test_gpt_oss_120b_has_the_published_parameter_count():
    # openai/gpt-oss-120b's model card: 116.83B parameters (36 layers, 128 experts top-4, biases, untied)
    model = OSS.replace(num_layers=36, hidden_size=2880, num_attention_heads=64, num_query_groups=8, kv_channels=64,
                        seq_length=4096, vocab_size=201088, make_vocab_size_divisible_by=128, num_experts=128,
                        moe_router_topk=4, moe_ffn_hidden_size=2880, untie_embeddings_and_output_weights=True,
                        normalization="RMSNorm", softmax_type="learnable")
    assert model.num_params() == pytest.approx(116.83e9, rel=2e-4)


@pytest.mark.parametrize("changes, rule", [
    (dict(swiglu=True), "`quick_geglu` excludes"),
    (dict(quick_geglu=False), "needs a gated activation"),
    (dict(activation_func_clamp_value=-1.0), "activation_func_clamp_value > 0"),
    (dict(moe_layer_freq="([0]+[1])"), "cannot fuse quick-GeGLU"),
    (dict(quick_geglu=False, swiglu=True, activation_func_clamp_value=None), "`glu_linear_offset` needs quick-GeGLU"),
])
def test_megatrons_rules_on_the_gated_activation(changes, rule):
    with pytest.raises(ConfigError, match=rule):
        OSS.replace(**changes)


def test_a_dense_quick_geglu_runs_unfused_where_megatron_allows_it():
    ok = OSS.replace(moe_layer_freq="([0]+[1])", bias_gelu_fusion=False)
    assert ok.gated_linear_unit and not ok.swiglu
