"""config/rules/local_spec.py: the rules Megatron-LM d98e8a64ddf3 asserts for --transformer-impl local, and its flags."""

import pytest

from echo_tune.config import ParallelConfig, check_compatible, load_cluster
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.errors import ConfigError

SMALL = dict(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=256, vocab_size=512)
LOCAL = ModelSpec(**SMALL, transformer_impl="local")
RMS_LOCAL = LOCAL.replace(normalization="RMSNorm", no_persist_layer_norm=True)
H100 = load_cluster("h100-sxm")


def _check(model, num_gpus=8, **kw):
    kw.setdefault("global_batch_size", 64)
    return check_compatible(model, H100, num_gpus, ParallelConfig(**kw))


def test_local_spec_never_runs_flash_attention():
    # LocalSpecProvider.core_attention is DotProductAttention whatever --attention-backend says
    for backend in ("auto", "flash", "fused"):
        assert ModelSpec(**SMALL, attention_backend=backend).flash_attention
        assert not LOCAL.replace(attention_backend=backend).flash_attention


def test_apply_query_key_layer_scaling_turns_on_fp32_softmax():
    assert not LOCAL.softmax_in_fp32
    assert LOCAL.replace(apply_query_key_layer_scaling=True).softmax_in_fp32
    assert LOCAL.replace(attention_softmax_in_fp32=True).softmax_in_fp32


@pytest.mark.parametrize("changes,fragment", [
    (dict(normalization="RMSNorm"), "--no-persist-layer-norm"),
    (dict(normalization="RMSNorm", no_persist_layer_norm=True, apply_layernorm_1p=True), "apply_layernorm_1p"),
])
def test_torch_rmsnorm_rules(changes, fragment):
    with pytest.raises(ConfigError, match=fragment):
        LOCAL.replace(**changes)
    ModelSpec(**SMALL, **changes)  # Transformer Engine's norm takes them


def test_multi_latent_attention_under_the_local_spec_is_refused():
    with pytest.raises(UnmodelledError, match="multi_latent_attention"):
        LOCAL.replace(multi_latent_attention=True, q_lora_rank=32, kv_lora_rank=32, qk_head_dim=16,
                      qk_pos_emb_head_dim=8, v_head_dim=16, position_embedding_type="rope")


@pytest.mark.parametrize("model,kw,fragment", [
    (LOCAL, dict(context_parallel_size=2), "context_parallel_size == 1"),
    (RMS_LOCAL, dict(tensor_model_parallel_size=2, sequence_parallel=True), "sequence_parallel"),
    (LOCAL, dict(delay_wgrad_compute=True), "delay_wgrad_compute"),
    (LOCAL, dict(fp8_format="hybrid"), "fp8_format"),
    (LOCAL, dict(tensor_model_parallel_size=2, sequence_parallel=True, tp_comm_overlap=True), "tp_comm_overlap"),
])
def test_layout_rules(model, kw, fragment):
    with pytest.raises(ConfigError, match=fragment) as err:
        _check(model, **kw)
    assert "\\n" not in str(err.value)


def test_local_layouts_that_megatron_runs_pass():
    _check(LOCAL, tensor_model_parallel_size=2, sequence_parallel=True)  # Apex FusedLayerNorm takes SP
    _check(RMS_LOCAL, tensor_model_parallel_size=2)  # torch RMSNorm without SP
    _check(RMS_LOCAL, sequence_parallel=True)  # Megatron turns SP off at TP=1


def test_local_flags_round_trip():
    line = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 256 --vocab-size 512 "
            "--transformer-impl local --no-masked-softmax-fusion --attention-softmax-in-fp32 "
            "--apply-query-key-layer-scaling --no-persist-layer-norm")
    model, parallel, _, ignored = parse_megatron_line(line)
    assert ignored == []
    assert {k: model[k] for k in ("transformer_impl", "masked_softmax_fusion", "attention_softmax_in_fp32",
                                  "apply_query_key_layer_scaling")} == {
        "transformer_impl": "local", "masked_softmax_fusion": False, "attention_softmax_in_fp32": True,
        "apply_query_key_layer_scaling": True}
    flags = to_megatron_flags(model, {"micro_batch_size": 1, **parallel}, "fp16")
    for flag in ("--no-masked-softmax-fusion", "--attention-softmax-in-fp32", "--apply-query-key-layer-scaling"):
        assert flag in flags
    assert flags[flags.index("--transformer-impl") + 1] == "local"
    again, _, _, _ = parse_megatron_line(" ".join(flags))
    assert again == model
    # Megatron's defaults are not written back
    default = to_megatron_flags(parse_megatron_line(line.split(" --transformer-impl")[0])[0], {}, "bf16")
    assert "--no-masked-softmax-fusion" not in default and "--transformer-impl" not in default
