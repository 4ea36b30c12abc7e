"""Hugging Face config.json -> Megatron ModelSpec, with real configs' values (sources in data/hf/SOURCES.md)."""

import json
from pathlib import Path

import pytest

from echo_tune.config.load.hf_config import load_hf_config, model_fields_from_hf
from echo_tune.config.load.loading import load_model
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.errors import ConfigError

HF = Path(__file__).parent.parent / "data" / "hf"


def _cfg(name: str) -> dict:
    return json.loads((HF / name).read_text())


def test_llama_31_70b_maps_to_megatron_names_and_matches_the_preset_shape():
    model = load_model(str(HF / "llama-3.1-70b.json"))
    assert (model.num_layers, model.hidden_size, model.num_attention_heads) == (80, 8192, 64)
    assert model.num_query_groups == 8 and model.ffn_hidden_size == 28672 and model.vocab_size == 128256
    assert model.swiglu and model.normalization == "RMSNorm" and model.position_embedding_type == "rope"
    assert model.untie_embeddings_and_output_weights and not model.add_bias_linear
    assert model.seq_length == 8192  # rope_scaling.original_max_position_embeddings, not 131072
    preset = load_model("llama3.1-70b")
    assert model.num_params() == preset.num_params()


def test_seq_length_override_and_note():
    fields, notes = model_fields_from_hf(_cfg("llama-3.1-70b.json"))
    assert any("original_max_position_embeddings" in n for n in notes)
    assert load_hf_config(HF / "llama-3.1-70b.json", seq_length=4096).seq_length == 4096


def test_mixtral_is_moe_with_megatron_expert_names():
    model = load_hf_config(HF / "mixtral-8x7b.json", seq_length=32768)
    assert model.num_experts == 8 and model.moe_router_topk == 2 and model.ffn_hidden_size == 14336
    assert model.num_params() == load_model("mixtral-8x7b").replace(seq_length=32768).num_params()


def test_qwen25_has_gqa_and_its_vocabulary():
    model = load_hf_config(HF / "qwen2.5-7b.json", seq_length=4096)
    assert (model.num_layers, model.hidden_size, model.num_query_groups, model.ffn_hidden_size) == (28, 3584, 4, 18944)
    assert model.vocab_size == 152064 and model.seq_length == 4096


@pytest.mark.parametrize("name", ["qwen2.5-7b.json", "qwen3-30b-a3b.json", "mistral-7b-v0.1.json",
                                  "mixtral-8x7b.json"])
def test_a_config_without_a_pretraining_length_needs_seq_length(name):
    """max_position_embeddings is the longest context, not the training length (131072 for Qwen2.5): no
    silent default; the error names --seq-length."""
    with pytest.raises(ConfigError, match="--seq-length") as err:
        load_model(str(HF / name))
    assert "\n" not in str(err.value)
    assert load_hf_config(HF / name, seq_length=2048).seq_length == 2048


def test_qwen3_moe_head_dim_and_qk_norm():
    model = load_hf_config(HF / "qwen3-30b-a3b.json", seq_length=4096)
    preset = load_model("qwen3-30b-a3b")
    for f in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "num_experts",
              "moe_router_topk", "moe_ffn_hidden_size", "qk_layernorm", "vocab_size"):
        assert getattr(model, f) == getattr(preset, f), f


def test_deepseek_v3_mla_dense_first_layers_and_mtp():
    model = load_hf_config(HF / "deepseek-v3.json")
    preset = load_model("deepseek-v3")
    assert model.seq_length == 4096 and model.moe_pattern == preset.moe_pattern
    for f in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
              "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers"):
        assert getattr(model, f) == getattr(preset, f), f


def test_gpt2_learned_positions_layernorm_biases_tied():
    model = load_model(str(HF / "gpt2.json"))
    assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.seq_length) == (12, 768, 12, 1024)
    assert model.ffn_size == 3072 and model.normalization == "LayerNorm" and model.add_bias_linear
    assert not model.untie_embeddings_and_output_weights and model.position_embedding_type == "learned_absolute"


def test_mistral_sliding_window_maps_to_window_size_and_qwen2_window_is_refused():
    model = load_hf_config(HF / "mistral-7b-v0.1.json", seq_length=32768)  # sliding_window 4096 < 32768
    assert model.window_size == (4096, 0) and model.windowed_attention and all(model.window_pattern)
    assert load_hf_config(HF / "mistral-7b-v0.1.json", seq_length=4096).window_size is None
    cfg = _cfg("llama-3.1-70b.json") | {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 1024}
    with pytest.raises(UnmodelledError, match="sliding_window"):
        model_fields_from_hf(cfg, seq_length=4096)


def test_partial_rotary_maps_to_rotary_percent():
    fields, _ = model_fields_from_hf(_cfg("llama-3.1-70b.json") | {"partial_rotary_factor": 0.5})
    assert fields["rotary_percent"] == 0.5


@pytest.mark.parametrize("key,value,word", [("use_parallel_residual", True, "parallel"),
                                            ("mlp_only_layers", [0, 1], "mlp_only_layers"),
                                            ("some_new_knob", 3, "not known")])
def test_step_shaping_or_unknown_keys_are_refused(key, value, word):
    cfg = _cfg("llama-3.1-70b.json") | {key: value}
    with pytest.raises(UnmodelledError, match=word):
        model_fields_from_hf(cfg)


def test_deepseek_sparse_moe_layer_frequency_is_refused():
    with pytest.raises(UnmodelledError, match="moe_layer_freq"):
        model_fields_from_hf(_cfg("deepseek-v3.json") | {"moe_layer_freq": 2})


def test_unsupported_model_type_and_bad_json(tmp_path):
    with pytest.raises(ConfigError, match="model_type"):
        model_fields_from_hf({"model_type": "bert"})
    bad = tmp_path / "config.json"
    bad.write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_model(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_model(str(tmp_path / "missing.json"))


# config.json files that leave keys out, or set them oddly, read as transformers reads them (checked against
# transformers 4.57.1's configuration classes): each was read differently before
def _qwen3(**changes) -> dict:
    cfg = {"model_type": "qwen3", "hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 8,
           "head_dim": 128, "intermediate_size": 9728, "num_hidden_layers": 36, "vocab_size": 151936,
           "tie_word_embeddings": True, "hidden_act": "silu", "max_position_embeddings": 40960}
    cfg.update(changes)
    return {k: v for k, v in cfg.items() if v is not None}


def test_qwen3_without_head_dim_has_heads_of_128():
    # Qwen3Config(head_dim=128): Qwen3-4B is 32 heads of 128 over a hidden size of 2560, not 80-wide heads
    fields, _ = model_fields_from_hf(_qwen3(head_dim=None), seq_length=4096)
    assert fields["kv_channels"] == 128
    assert model_fields_from_hf(_qwen3(), seq_length=4096)[0]["kv_channels"] == 128


def test_biases_megatron_cannot_place_are_refused_by_name():
    with pytest.raises(UnmodelledError, match="attention_bias"):  # q/k/v/o biases: no Megatron flag adds those
        model_fields_from_hf(_qwen3(attention_bias=True), seq_length=4096)
    llama = _cfg("llama-3.1-70b.json")
    with pytest.raises(UnmodelledError, match="mlp_bias"):
        model_fields_from_hf({**llama, "mlp_bias": True, "attention_bias": False})
    assert model_fields_from_hf({**llama, "mlp_bias": True, "attention_bias": True})[0]["add_bias_linear"]


def test_a_qwen_sliding_window_is_off_unless_turned_on():
    # Qwen2Config: use_sliding_window defaults to False (sliding_window is then None): full attention
    qwen = _qwen3(sliding_window=4096)
    assert "window_size" not in model_fields_from_hf(qwen, seq_length=8192)[0]
    with pytest.raises(UnmodelledError, match="sliding_window"):
        model_fields_from_hf({**qwen, "use_sliding_window": True}, seq_length=8192)


def test_gpt_neox_defaults_are_transformers_defaults():
    neox = {"model_type": "gpt_neox", "hidden_size": 2048, "num_attention_heads": 8, "num_hidden_layers": 16,
            "intermediate_size": 8192, "vocab_size": 50304, "max_position_embeddings": 2048}
    with pytest.raises(UnmodelledError, match="use_parallel_residual"):  # GPTNeoXConfig: True when left out
        model_fields_from_hf(neox, seq_length=2048)
    fields, _ = model_fields_from_hf({**neox, "use_parallel_residual": False}, seq_length=2048)
    assert fields["rotary_percent"] == 0.25  # GPTNeoXConfig: rotary_pct 0.25 when left out


def test_a_stated_seq_length_key_is_read():
    fields, notes = model_fields_from_hf(_qwen3(seq_length=4096))
    assert fields["seq_length"] == 4096 and any("seq_length key" in n for n in notes)


def test_unnormalised_top_k_routing_is_named():
    # Qwen3-MoE / DeepSeek-V2 leave the top-k weights unnormalised unless norm_topk_prob: Megatron's router
    # renormalises unless --moe-router-pre-softmax
    moe = {**_qwen3(), "model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 768, "norm_topk_prob": False}
    moe.pop("head_dim")
    _, notes = model_fields_from_hf(moe, seq_length=4096)
    assert any("--moe-router-pre-softmax" in n for n in notes)
    _, notes = model_fields_from_hf({**moe, "norm_topk_prob": True}, seq_length=4096)
    assert not any("--moe-router-pre-softmax" in n for n in notes)
