"""megatron_args.txt rebuilds the model that was read (issue 20 item 3): model -> flags -> parse -> same model.

For every shipped preset and every config.json of tests/config/data/hf: the flags ``to_megatron_flags`` writes
(what search's megatron_args.txt holds), read back by ``parse_megatron_line`` as Megatron's argparse would,
give the same ModelSpec field for field (one group per head is written as Megatron's default MHA, so
``num_query_groups == num_attention_heads`` and None are the same model).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from echo_tune.cli.main import main
from echo_tune.config.load.hf_config import load_hf_config, model_fields_from_hf
from echo_tune.config.load.loading import load_model, preset_names
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
from echo_tune.config.specs.model import ModelSpec

HF = Path(__file__).parent / "data" / "hf"
CONFIGS = sorted(p.name for p in HF.glob("*.json"))


def _fields(model: ModelSpec) -> dict:
    out = {f.name: getattr(model, f.name) for f in dataclasses.fields(model)}
    if out["num_query_groups"] == out["num_attention_heads"]:
        out["num_query_groups"] = None
    return out


def _round_trip(model: ModelSpec) -> tuple[ModelSpec, list[str]]:
    flags = to_megatron_flags(_fields(model), {"global_batch_size": 8}, "bf16")
    fields, _, precision, _ = parse_megatron_line(" ".join(flags))
    assert precision == "bf16"
    return ModelSpec(name=model.name, **fields), flags


@pytest.mark.parametrize("name", preset_names("models"))
def test_every_preset_round_trips(name):
    model = load_model(name)
    again, _ = _round_trip(model)
    assert _fields(again) == _fields(model)


@pytest.mark.parametrize("name", CONFIGS)
@pytest.mark.parametrize("seq_length", [None, 2048])
def test_every_config_json_round_trips(name, seq_length):
    import json

    cfg = json.loads((HF / name).read_text())
    stated = "original_max_position_embeddings" in str(cfg.get("rope_scaling")) or name == "gpt2.json"
    if seq_length is None and not stated:
        pytest.skip("no stated training length: --seq-length is required (test_hf_config.py)")
    model = load_hf_config(HF / name, seq_length=seq_length)
    again, _ = _round_trip(model)
    assert _fields(again) == _fields(model)


def test_qwen25_line_has_its_qkv_bias_rope_base_and_epsilon():
    _, flags = _round_trip(load_hf_config(HF / "qwen2.5-7b.json", seq_length=4096))
    line = " ".join(flags)
    for part in ("--disable-bias-linear", "--add-qkv-bias", "--rotary-base 1000000", "--norm-epsilon 1e-06",
                 "--max-position-embeddings 131072"):
        assert part in line, part
    llama = " ".join(_round_trip(load_hf_config(HF / "llama-3.1-70b.json"))[1])
    assert "--use-rope-scaling" in llama and "--rotary-base 500000" in llama
    assert "--norm-epsilon" not in llama  # 1e-5 is Megatron's default


def test_what_megatron_cannot_express_is_named():
    cfg = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
           "vocab_size": 100, "intermediate_size": 128, "max_position_embeddings": 8192,
           "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 2.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}}
    _, notes = model_fields_from_hf(cfg, seq_length=1024)
    assert any("cannot be written" in n and "low_freq_factor" in n for n in notes)


def test_search_writes_a_megatron_args_txt_that_rebuilds_the_config(tmp_path, capsys):
    model = load_hf_config(HF / "qwen2.5-7b.json", seq_length=1024)
    assert main(["search", "--model", str(HF / "qwen2.5-7b.json"), "--seq-length", "1024", "--cluster", "h100",
                 "--num-gpus", "8", "--global-batch-size", "16", "--n-trials", "3", "--results-dir",
                 str(tmp_path)]) in (0, 1)
    text = next(tmp_path.rglob("megatron_args.txt")).read_text()
    line = " ".join(ln for ln in text.splitlines() if not ln.startswith("#"))
    fields, _, _, _ = parse_megatron_line(line)
    assert _fields(ModelSpec(name=model.name, **fields)) == _fields(model)
