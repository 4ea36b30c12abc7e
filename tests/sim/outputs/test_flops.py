"""FLOPs per step against Megatron-LM's ``num_floating_point_operations`` (megatron/training/training.py,
NVIDIA/Megatron-LM commit d98e8a64ddf3), worked out by hand for each configuration below.

Megatron's count, BSHD: tokens = B s; per token 6 x (h x MLP weights + attention projection weights +
h x padded vocab x (1 + MTP)), plus 6 x B s^2 x core per layer, core = a d / 2 x 2 (causal mask, QK^T and
PV), or a (qk + pos) / 2 + a v / 2 for MLA. Expected values are written out term by term.
"""

import pytest

import echo_tune as et
from echo_tune.sim.outputs.flops import model_flops_per_step


def test_gpt3_closed_form_with_causal_halving():
    # MHA, ffn 4h, GeLU: per layer 12 h^2 weights -> 72 B s L h^2 (1 + s/(12h) + V/(12 h L)), V = 51200
    gpt3 = et.load_model("gpt3-175b")
    b, s, L, h, V = 1536, 2048, 96, 12288, 51200
    expected = 72 * b * s * L * h * h * (1 + s / (12 * h) + V / (12 * h * L))
    assert model_flops_per_step(gpt3, b) == pytest.approx(expected, rel=1e-12)


def test_vocab_is_padded_to_divisible_by_times_tp():
    # llama3-8b: vocab 128256 = 1002 x 128, so TP 1 pads nothing; TP 3: multiple of 384 -> 128256 is 334 x 384
    # exactly; TP 5: multiple of 640 -> 128640 (201 x 640). Only the logits term changes: 6 B s h dV.
    llama = et.load_model("llama3-8b")
    b, s, h = 8, 8192, 4096
    base = model_flops_per_step(llama, b, 1)
    assert model_flops_per_step(llama, b, 3) == base
    assert model_flops_per_step(llama, b, 5) - base == pytest.approx(6 * b * s * h * (128640 - 128256), rel=1e-12)


def test_mixtral_8x7b_moe():
    # h 4096, a 32, GQA 8, d 128, 32 layers all MoE, 8 experts top-2, expert ffn 14336, SwiGLU, V 32000, s 4096
    m = et.ModelSpec(num_layers=32, hidden_size=4096, num_attention_heads=32, num_query_groups=8,
                     ffn_hidden_size=14336, seq_length=4096, vocab_size=32000, swiglu=True,
                     num_experts=8, moe_router_topk=2)
    b = 256
    attention = 4096 * (32 * 128 + 2 * 8 * 128) + 32 * 128 * 4096   # = 41,943,040
    experts = 4096 * 14336 * 2 * 3                                     # = 352,321,536 (top-2, SwiGLU)
    logits = 4096 * 32000                                              # = 131,072,000
    per_token = 6 * (32 * (attention + experts) + logits)              # = 76,485,230,592
    core = 6 * 32 * 128 * 32                                           # per token pair, 32 layers
    expected = b * 4096 * per_token + b * 4096 * 4096 * core
    assert expected == 83_578_276_873_764_864  # 8.36e16 FLOPs per step of 256 x 4096 tokens
    assert model_flops_per_step(m, b) == pytest.approx(expected, rel=1e-12)


def test_deepseek_v3_mla_shared_expert_dense_layers_and_mtp():
    # DeepSeek-V3 (Megatron-LM examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh): 61 layers, first 3
    # dense (ffn 18432), 58 MoE with 256 experts top-8 of 2048 + a 2048 shared expert; MLA q_lora 1536,
    # kv_lora 512, qk 128, rope 64, v 128, 128 heads, h 7168; 1 MTP layer (MoE, as the last layer);
    # vocab 129280 padded to a multiple of 3232 -> 129280 (40 x 3232); s 4096.
    m = et.ModelSpec(num_layers=61, hidden_size=7168, num_attention_heads=128, ffn_hidden_size=18432,
                     seq_length=4096, vocab_size=129280, make_vocab_size_divisible_by=3232, swiglu=True,
                     num_experts=256, moe_router_topk=8, moe_ffn_hidden_size=2048,
                     moe_shared_expert_intermediate_size=2048, moe_layer_freq="([0]*3+[1]*58)",
                     multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512, qk_head_dim=128,
                     qk_pos_emb_head_dim=64, v_head_dim=128, mtp_num_layers=1)
    b, h = 2048, 7168
    q = 1536 * (h + 128 * (128 + 64) + 1)
    kv = 512 * (h + 128 * (128 + 128) + 1)
    attention = q + kv + h * 64 + 128 * 128 * h
    dense_mlp, moe_mlp = 18432 * 3, (2048 * 8 + 2048) * 3
    mlp = h * (dense_mlp * 3 + moe_mlp * (58 + 1))                   # MTP layer counted as MoE
    mtp = 3 * h + 2 * h * h
    per_token = 6 * (mlp + attention * 62 + mtp + h * 129280 * 2)
    core = 6 * (128 * 192 / 2 + 128 * 128 / 2) * 62
    expected = b * 4096 * per_token + b * 4096 * 4096 * core
    assert model_flops_per_step(m, b) == pytest.approx(expected, rel=1e-12)
    # about 1.5e19 per step of 2048 x 4096 tokens: ~ 6 x 37B active parameters per token, plus attention
    assert 6 * 37e9 * b * 4096 < expected < 2.2 * 6 * 37e9 * b * 4096


def test_moe_layer_freq_integer_and_kv_channels():
    # every 2nd layer MoE (layers 0, 2): 2 MoE + 2 dense; kv_channels 64 with 8 heads of a 1024 model
    m = et.ModelSpec(num_layers=4, hidden_size=1024, num_attention_heads=8, kv_channels=64, ffn_hidden_size=4096,
                     seq_length=1024, vocab_size=1024, num_experts=4, moe_router_topk=1, moe_layer_freq=2,
                     moe_ffn_hidden_size=512)
    b = 2
    attention = 1024 * (8 * 64 * 3) + 8 * 64 * 1024
    mlp = 1024 * (4096 * 2 * 2 + 512 * 1 * 2 * 2)
    per_token = 6 * (mlp + attention * 4 + 1024 * 1024)
    expected = b * 1024 * per_token + b * 1024 * 1024 * 6 * (8 * 64) * 4
    assert model_flops_per_step(m, b) == pytest.approx(expected, rel=1e-12)
