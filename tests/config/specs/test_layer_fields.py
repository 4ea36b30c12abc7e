"""Layer-variant fields: --window-size forms, Megatron's window layer rule, flags round trip, refusals."""

import pytest

from echo_tune.config.specs.layer_fields import parse_window_size
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
from echo_tune.config.specs.model import ModelSpec
from echo_tune.errors import ConfigError

SMALL = dict(num_layers=4, hidden_size=64, num_attention_heads=4, seq_length=256, vocab_size=512)


@pytest.mark.parametrize("raw,expected", [("128", (128, 0)), ("127,0", (127, 0)), ("(128, 0)", (128, 0)),
                                          (64, (64, 0)), ([32, 0], (32, 0)), (None, None)])
def test_window_size_forms(raw, expected):
    assert parse_window_size(raw) == expected


def test_bad_window_size_is_one_line_error():
    with pytest.raises(ConfigError, match="window_size"):
        parse_window_size("a,b")


def test_window_layers_follow_megatron_is_layer_window_attention():
    # utils.py: 1-based layer_number % N != 0 -> window; N=2 over 4 layers: layers 1, 3 windowed, 2, 4 full
    m = ModelSpec(**SMALL, window_size=(63, 0), window_attn_skip_freq=2)
    assert m.window_pattern == (1, 0, 1, 0)
    assert ModelSpec(**SMALL, window_size=(63, 0)).window_pattern == (1, 1, 1, 1)
    assert ModelSpec(**SMALL, window_size=(63, 0), window_attn_skip_freq="[1,1,0,0]").window_pattern == (1, 1, 0, 0)
    assert not ModelSpec(**SMALL, window_size=(-1, 0)).windowed_attention
    assert not ModelSpec(**SMALL, window_size=(255, 0)).windowed_attention  # the window covers the sequence


def test_learnable_softmax_adds_one_parameter_per_head():
    base = ModelSpec(**SMALL)
    assert ModelSpec(**SMALL, softmax_type="learnable").layer_params() - base.layer_params() == 4
    assert ModelSpec(**SMALL, softmax_type="off-by-one").layer_params() == base.layer_params()


def test_transformer_impl_takes_megatrons_two_training_specs():
    assert ModelSpec(**SMALL, transformer_impl="local").local_spec
    with pytest.raises(ConfigError, match="transformer_impl"):
        ModelSpec(**SMALL, transformer_impl="inference_optimized")


def test_layer_flags_round_trip():
    line = ("--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 256 --vocab-size 512 "
            "--window-size 128 --window-attn-skip-freq 2 --softmax-type learnable --rotary-percent 0.5 "
            "--rotary-interleaved --apply-layernorm-1p --no-rope-fusion --no-bias-gelu-fusion "
            "--no-bias-dropout-fusion --no-persist-layer-norm --cross-entropy-loss-fusion "
            "--cross-entropy-fusion-impl te --no-gradient-accumulation-fusion --deterministic-mode "
            "--position-embedding-type rope")
    model, parallel, _, ignored = parse_megatron_line(line)
    assert model["window_size"] == (128, 0) and model["window_attn_skip_freq"] == 2 and ignored == []
    assert parallel == {"gradient_accumulation_fusion": False, "deterministic_mode": True}
    flags = to_megatron_flags(model, {"micro_batch_size": 1, **parallel}, "bf16")
    assert "--window-size" in flags and flags[flags.index("--window-size") + 1] == "128,0"
    again, parallel_again, _, _ = parse_megatron_line(" ".join(flags))
    assert again == model and {k: parallel_again[k] for k in parallel} == parallel


def test_squared_relu_and_swiglu_are_exclusive():
    with pytest.raises(ConfigError, match="squared_relu"):
        ModelSpec(**SMALL, squared_relu=True, swiglu=True)
