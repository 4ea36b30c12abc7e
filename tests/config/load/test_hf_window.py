"""Valid config.json files that were refused (issue 41 item 6): `layer_types` all `full_attention`, and a Qwen2
`max_window_layers` equal to the layer count, train full attention on every layer (transformers' Qwen2Config:
layer i runs the window only when i >= max_window_layers, or its layer_types entry says sliding_attention), so
they are read; a window on some layers only is still refused by name, and a malformed `layer_types` is one
line (config/load/hf_window.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_tune.cli.main import main
from echo_tune.config.load.hf_config import load_hf_config, model_fields_from_hf
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.errors import ConfigError

HF = Path(__file__).resolve().parent.parent / "data" / "hf"
QWEN = json.loads((HF / "qwen2.5-7b.json").read_text())  # 28 layers, max_window_layers 28
MISTRAL = json.loads((HF / "mistral-7b-v0.1.json").read_text())
LAYERS = QWEN["num_hidden_layers"]
WINDOW_ON = {"use_sliding_window": True, "sliding_window": 4096}


def _simulate(tmp_path, cfg: dict, capsys) -> tuple[int, str]:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    code = main(["simulate", "--model", str(path), "--seq-length", "8192", "--num-gpus", "8",
                 "--global-batch-size", "8"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("change", [
    {"layer_types": ["full_attention"] * LAYERS},
    {**WINDOW_ON, "layer_types": ["full_attention"] * LAYERS},
    {**WINDOW_ON, "max_window_layers": LAYERS},
    {**WINDOW_ON, "max_window_layers": LAYERS + 4},
    {**WINDOW_ON, "layer_types": ["sliding_attention"] * LAYERS, "sliding_window": 8192},  # covers the sequence
    {"layer_types": ["sliding_attention"] * LAYERS},  # use_sliding_window false: transformers drops the window
])
def test_full_attention_on_every_layer_is_read(tmp_path, capsys, change):
    code, err = _simulate(tmp_path, {**QWEN, **change}, capsys)
    assert code == 0, err
    fields, _ = model_fields_from_hf({**QWEN, **change}, seq_length=8192)
    assert "window_size" not in fields


def test_full_attention_qwen_is_the_same_model_as_without_the_keys():
    plain = model_fields_from_hf(QWEN, seq_length=8192)[0]
    spelled = model_fields_from_hf({**QWEN, **WINDOW_ON, "max_window_layers": LAYERS,
                                    "layer_types": ["full_attention"] * LAYERS}, seq_length=8192)[0]
    assert spelled == plain


@pytest.mark.parametrize("change,words", [
    ({**WINDOW_ON, "max_window_layers": 4}, "24 of 28 layers (max_window_layers)"),
    ({**WINDOW_ON, "max_window_layers": 0}, "every layer (max_window_layers)"),
    ({**WINDOW_ON, "layer_types": ["full_attention"] * 4 + ["sliding_attention"] * (LAYERS - 4)},
     "24 of 28 layers (layer_types)"),
])
def test_a_window_on_some_layers_is_still_refused_by_name(change, words):
    with pytest.raises(UnmodelledError, match="sliding_window") as err:
        model_fields_from_hf({**QWEN, **change}, seq_length=8192)
    assert words in str(err.value)


@pytest.mark.parametrize("layer_types,words", [
    (["full_attention"] * 3, "3 entries"), ("full", "'full'"), (["full_attention"] * 27 + ["chunked"], "'chunked'"),
    ([["full_attention"]] * LAYERS, "['full_attention']"),
])
def test_a_malformed_layer_types_is_one_line(tmp_path, capsys, layer_types, words):
    code, err = _simulate(tmp_path, {**QWEN, "layer_types": layer_types}, capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "'layer_types' must list one of" in err and words in err, err
    with pytest.raises(ConfigError, match="layer_types"):
        model_fields_from_hf({**QWEN, "layer_types": layer_types}, seq_length=8192)


def test_a_negative_max_window_layers_is_refused():
    with pytest.raises(ConfigError, match="max_window_layers >= 0"):
        model_fields_from_hf({**QWEN, **WINDOW_ON, "max_window_layers": -1}, seq_length=8192)


def test_mistral_windows_every_layer_unless_its_layer_types_say_full(tmp_path):
    layers = MISTRAL["num_hidden_layers"]
    assert load_hf_config(HF / "mistral-7b-v0.1.json", seq_length=32768).window_size == (4096, 0)
    path = tmp_path / "mistral.json"
    path.write_text(json.dumps({**MISTRAL, "layer_types": ["full_attention"] * layers}))
    assert load_hf_config(path, seq_length=32768).window_size is None
    path.write_text(json.dumps({**MISTRAL, "layer_types": ["sliding_attention"] * layers}))
    assert load_hf_config(path, seq_length=32768).window_size == (4096, 0)
    with pytest.raises(UnmodelledError, match="1 of 32 layers"):
        model_fields_from_hf({**MISTRAL, "layer_types": ["full_attention"] * (layers - 1) + ["sliding_attention"]},
                             seq_length=32768)
