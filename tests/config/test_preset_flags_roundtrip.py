"""Every model preset's Megatron-LM flags rebuild its model (issue 41): the model -> the flags search writes
(``search/outputs/results.py``: ``model_fields`` -> ``to_megatron_flags``, what megatron_args.txt and best.json hold)
-> ``parse_megatron_line`` -> the same ModelSpec; and a preset launches the model its config.json describes:
``llama3.1-70b`` printed neither ``--rotary-base 500000`` nor ``--use-rope-scaling`` (the config.json route wrote
both), so a pasted launch line trained another model than the one simulated."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest

from echo_tune.config.load.hf_config import load_hf_config
from echo_tune.config.load.loading import load_model, preset_names
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.rebuild_fields import RebuildFields
from echo_tune.search.outputs.results import model_fields

HF = Path(__file__).parent / "data" / "hf"
REBUILD = [f.name for f in dataclasses.fields(RebuildFields) if f.name != "max_position_embeddings"]
# presets with the model's own config.json among the test data (mistral-7b is v0.3, the file v0.1)
SAME_MODEL = {"llama3.1-70b": "llama-3.1-70b.json", "mixtral-8x7b": "mixtral-8x7b.json",
              "qwen2.5-7b": "qwen2.5-7b.json", "qwen3-30b-a3b": "qwen3-30b-a3b.json", "deepseek-v3": "deepseek-v3.json"}


def _fields(model: ModelSpec) -> dict:
    out = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "name"}
    if out["num_query_groups"] == out["num_attention_heads"]:
        out["num_query_groups"] = None  # one group per head is written as Megatron's default MHA
    return out


def _search_flags(model: ModelSpec) -> list[str]:
    """The flags search writes for ``model`` (results.megatron_flags' model half, a minimal layout)."""
    return to_megatron_flags(model_fields(SimpleNamespace(model=model)), {"global_batch_size": 8}, "bf16")


@pytest.mark.parametrize("name", preset_names("models"))
def test_every_presets_search_flags_rebuild_the_same_model(name):
    model = load_model(name)
    flags = _search_flags(model)
    fields, parallel, precision, ignored = parse_megatron_line(" ".join(flags))
    assert precision == "bf16" and ignored == [] and parallel["global_batch_size"] == 8
    assert _fields(ModelSpec(name=name, **fields)) == _fields(model), " ".join(flags)


@pytest.mark.parametrize("name", sorted(SAME_MODEL))
def test_a_preset_launches_the_model_its_config_json_describes(name):
    preset = load_model(name)
    from_json = load_hf_config(HF / SAME_MODEL[name], seq_length=preset.seq_length)
    assert {f: getattr(preset, f) for f in REBUILD} == {f: getattr(from_json, f) for f in REBUILD}
    preset_flags, json_flags = _search_flags(preset), _search_flags(from_json)
    for flag in ("--rotary-base", "--norm-epsilon", "--add-qkv-bias", "--use-rope-scaling", "--rotary-scaling-factor",
                 "--mscale", "--mscale-all-dim"):
        if flag in json_flags:
            at = json_flags.index(flag)
            assert flag in preset_flags, f"{name}: {flag} missing from {' '.join(preset_flags)}"
            value = json_flags[at + 1] if at + 1 < len(json_flags) and not json_flags[at + 1].startswith("--") else None
            if value is not None:  # the same number (a YAML 40 is written "40", a JSON 40.0 "40.0")
                assert float(preset_flags[preset_flags.index(flag) + 1]) == float(value), flag


def test_the_issue_preset_prints_its_rope_settings():
    line = " ".join(_search_flags(load_model("llama3.1-70b")))
    assert "--rotary-base 500000" in line and "--use-rope-scaling" in line
    assert "--rope-scaling-factor" not in line  # 8, Megatron's default: not written


# Each family's settings as its config.json and NVIDIA's launch scripts state them (sources in models.yaml).
FAMILIES = [
    (("llama3-8b", "llama3-70b", "llama3-405b"), {"rotary_base": 500000, "use_rope_scaling": False}),
    (("llama3.1-8b", "llama3.1-70b", "llama3.1-405b"), {"rotary_base": 500000, "use_rope_scaling": True,
                                                        "rope_scaling_factor": 8.0}),
    (("qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen2.5-72b"),
     {"add_qkv_bias": True, "rotary_base": 1000000, "norm_epsilon": 1e-6}),
    (("qwen3-30b-a3b", "qwen3-235b-a22b"), {"add_qkv_bias": False, "rotary_base": 1000000, "norm_epsilon": 1e-6}),
    (("mistral-7b", "mixtral-8x7b", "mixtral-8x22b"), {"rotary_base": 1000000, "norm_epsilon": 1e-5}),
    (("deepseek-v3",), {"norm_epsilon": 1e-6, "rotary_scaling_factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
    (("deepseek-v2-lite",), {"norm_epsilon": 1e-6, "rotary_scaling_factor": 40.0, "mscale": 0.707,
                             "mscale_all_dim": 0.707}),
    (("llama2-7b", "llama2-13b", "llama2-70b", "gpt3-175b", "nemotron-4-15b", "grok-1"),
     {"rotary_base": 10000, "norm_epsilon": 1e-5, "add_qkv_bias": False, "use_rope_scaling": False}),
]


@pytest.mark.parametrize("names,settings", FAMILIES, ids=[f[0][0] for f in FAMILIES])
def test_each_family_carries_its_rebuild_settings(names, settings):
    for name in names:
        model = load_model(name)
        assert {k: getattr(model, k) for k in settings} == settings, name
