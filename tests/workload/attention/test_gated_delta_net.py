"""The gated delta net layers (--experimental-attention-variant gdn), counted by hand from Megatron-LM d98e8a64ddf3
core/ssm/gated_delta_net/ and FLA's chunked algorithm (issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.errors import ConfigError
from echo_tune.sim.outputs.flops import _gdn_term
from echo_tune.workload.attention.gated_delta_net import chunk_rule_flops
from echo_tune.workload.tracer import trace_layer, trace_linear_layer

# Megatron-LM's functional test gpt3_mcore_te_tp2_pp1_gdn (dense MLP here): h 512, GDN 4 key heads and 8 value heads
# of 64, conv kernel 4, every third layer self-attention
MODEL = et.ModelSpec(name="gdn", num_layers=6, hidden_size=512, num_attention_heads=8, num_query_groups=2,
                     seq_length=1024, vocab_size=50257, swiglu=True, normalization="RMSNorm", add_bias_linear=False,
                     experimental_attention_variant="gated_delta_net", linear_attention_freq=3,
                     linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=4,
                     linear_num_value_heads=8)
KW = dict(tensor_model_parallel_size=2, sequence_parallel=True, micro_batch_size=4)


def test_the_flags_and_the_pattern():
    model, _, _, _ = parse_megatron_line("--experimental-attention-variant gated_delta_net --linear-attention-freq 3 "
                                         "--linear-num-value-heads 8")
    assert model["experimental_attention_variant"] == "gated_delta_net" and model["linear_attention_freq"] == 3
    # get_linear_attention_pattern: 0 (self-attention) where (i + 1) % 3 == 0
    assert MODEL.linear_attention_pattern == (1, 1, 0, 1, 1, 0)
    assert MODEL.replace(linear_attention_freq="[1,0,1,0,1,0]").linear_attention_pattern == (1, 0, 1, 0, 1, 0)


@pytest.mark.parametrize("variant, match", [("gdn2", "gdn2.*not modelled"), ("dsa", "dsa.*not modelled")])
def test_other_variants_are_refused_by_name(variant, match):
    with pytest.raises(ConfigError, match=match):
        MODEL.replace(experimental_attention_variant=variant)


def test_parameters_by_hand():
    # in_proj 512 x (2*256 + 2*512 + 2*8) = 794,624; conv (2*256 + 512) x 4 = 4,096; dt_bias + A_log 16; output
    # RMSNorm 64; out_proj 512 x 512 = 262,144
    assert MODEL.gdn_params() == 794_624 + 4_096 + 16 + 64 + 262_144
    # one TP-2 rank: half of each, the output norm whole
    linear, attention = trace_linear_layer(MODEL, **KW), trace_layer(MODEL, **KW)
    qkv, proj = 512 * (8 + 2 * 2) * 64 // 2, 8 * 64 * 512 // 2  # GQA: 8 query heads, 2 groups of 64
    assert linear.param_count - attention.param_count == (794_624 + 4_096 + 16 + 262_144) // 2 + 64 - qkv - proj


def test_fla_delta_rule_flops_by_hand():
    # per token and head: 6 c dk + 4 c dv + 6 dk dv + 2 c^2 / 3 with c = 64, dk = dv = 64
    per_token = 6 * 64 * 64 + 4 * 64 * 64 + 6 * 64 * 64 + 2 * 64 * 64 / 3
    assert chunk_rule_flops(4, 1024, 4, 64, 64) == pytest.approx(4 * 1024 * 4 * per_token)
    t = trace_linear_layer(MODEL, **KW)
    (rule,) = [op for op in t.forward if op.region == "linear_attention" and op.kind == "attention"]
    assert rule.flops == pytest.approx(4 * 1024 * 4 * per_token)  # 4 value heads per rank, micro-batch 4


def test_deterministic_path_is_megatrons_torch_loop():
    # torch_chunk_gated_delta_rule: 3 matmuls before the chunk loop (K_beta K^T, A V_beta, A K_beta e^g) and 5 in
    # each of the 1024 / 64 = 16 chunks (Q K^T, W S, Q e^g S, A v_new, K^T v_new)
    t = trace_linear_layer(MODEL, **KW, deterministic=True)
    gemms = [op for op in t.forward if op.region == "linear_attention" and op.kind == "gemm"]
    assert len(gemms) == 3 + 5 * 16
    assert not [op for op in t.forward if op.kind == "attention"]


def test_model_flops_term_by_hand():
    # training.py linear_self_attn_term before 3 x 2: 512 x 1552 + 4 x 1024 + 8 x 64^2 x 4 + 512 x 512
    assert _gdn_term(MODEL) == 512 * 1552 + 4 * 1024 + 8 * 64 * 64 * 4 + 512 * 512
