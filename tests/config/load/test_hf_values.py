"""config.json values are read with their types checked (config/load/hf_values.py): nothing truncated, nothing
turned into a traceback, every problem of a file reported at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo_tune.config.load.hf_config import model_fields_from_hf
from echo_tune.errors import ConfigError

HF = Path(__file__).parent.parent / "data" / "hf"
LLAMA = json.loads((HF / "llama-3.1-70b.json").read_text())
DEEPSEEK = json.loads((HF / "deepseek-v3.json").read_text())


@pytest.mark.parametrize("key,value", [("hidden_size", 8192.9), ("hidden_size", "8192"), ("hidden_size", None),
                                       ("hidden_size", [8192]), ("hidden_size", float("nan")), ("hidden_size", True),
                                       ("num_key_value_heads", 8.5), ("head_dim", "128"), ("sliding_window", [1]),
                                       ("intermediate_size", float("inf")), ("attention_dropout", "0.1")])
def test_a_wrong_type_is_one_line_naming_the_key(key, value):
    with pytest.raises(ConfigError) as err:
        model_fields_from_hf({**LLAMA, key: value}, seq_length=1024)
    assert key in str(err.value) and "\n" not in str(err.value)


def test_an_integral_float_is_read_as_its_integer():
    fields, _ = model_fields_from_hf({**LLAMA, "hidden_size": 8192.0}, seq_length=1024)
    assert fields["hidden_size"] == 8192 and type(fields["hidden_size"]) is int


def test_first_k_dense_replace_is_bounded_before_the_pattern_is_built():
    with pytest.raises(ConfigError, match="first_k_dense_replace"):
        model_fields_from_hf({**DEEPSEEK, "first_k_dense_replace": 10**12})
    with pytest.raises(ConfigError, match="first_k_dense_replace"):
        model_fields_from_hf({**DEEPSEEK, "first_k_dense_replace": -1})


def test_rope_scaling_fields_are_checked():
    scaling = {**LLAMA["rope_scaling"], "original_max_position_embeddings": "8192"}
    with pytest.raises(ConfigError, match="rope_scaling.original_max_position_embeddings"):
        model_fields_from_hf({**LLAMA, "rope_scaling": scaling})
    with pytest.raises(ConfigError, match="rope_scaling.factor"):
        model_fields_from_hf({**LLAMA, "rope_scaling": {**LLAMA["rope_scaling"], "factor": "x"}})


def test_every_bad_value_at_once():
    with pytest.raises(ConfigError) as err:
        model_fields_from_hf({**LLAMA, "hidden_size": "x", "vocab_size": 1.5, "num_hidden_layers": None})
    lines = str(err.value).splitlines()
    assert lines[0] == "3 problems in config.json:" and len(lines) == 4
    assert [k for k in ("hidden_size", "vocab_size", "num_hidden_layers") if any(k in line for line in lines)] == [
        "hidden_size", "vocab_size", "num_hidden_layers"]
