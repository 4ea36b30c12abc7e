"""Search-space files: parsing, auto expansion, and one-line errors for bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from echo_tune.errors import ConfigError
from echo_tune.search import check_space, load_space
from echo_tune.search.space.search_space import FIELD_ORDER, space_from_dict

SPACES = Path(__file__).resolve().parents[3] / "search_spaces"

EXAMPLES = sorted(SPACES.glob("*.yaml"))
BASE = {"model": "gpt3-175b", "cluster": "a100-80gb", "num_gpus": 1024, "global_batch_size": 1536}


def test_the_issue_examples_ship():
    names = {p.stem for p in EXAMPLES}
    assert {"gpt3-175b-1024xa100", "gpt3-175b-96xh800", "llama3-70b-64xh100", "small-gpt7b-16xa100"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_examples_load_and_hold_valid_layouts(path):
    space = load_space(path)
    valid, notes = check_space(space)
    assert valid and not notes  # no listed value is dead weight
    assert set(space.choices) == set(FIELD_ORDER)


def test_auto_expansion_gpt3_on_1024_a100():
    space = load_space(SPACES / "gpt3-175b-1024xa100.yaml")
    assert space.choices["tensor_model_parallel_size"] == (1, 2, 4, 8)  # inside a node, dividing 96 heads
    assert space.choices["pipeline_model_parallel_size"] == (1, 2, 4, 8, 16, 32)  # divide 96 layers and 1024
    assert space.choices["sequence_parallel"] == (False, True)
    assert space.choices["virtual_pipeline_model_parallel_size"][0] is None  # 1 means "no interleaving"


def test_auto_respects_query_groups_and_sequence():
    space = space_from_dict({**BASE, "model": "llama3-70b", "num_gpus": 64, "global_batch_size": 512,
                             "layout": {"tensor_model_parallel_size": "auto", "context_parallel_size": "auto",
                                        "virtual_pipeline_model_parallel_size": "auto",
                                        "pipeline_model_parallel_size": [4]}})
    assert space.choices["tensor_model_parallel_size"] == (1, 2, 4, 8)
    assert all(8192 % (2 * c) == 0 for c in space.choices["context_parallel_size"] if c > 1)
    assert space.choices["virtual_pipeline_model_parallel_size"] == (None, 2, 4, 5, 10, 20)  # 80/4 = 20 layers


def test_none_and_single_values():
    space = space_from_dict({**BASE, "layout": {"recompute_granularity": ["none", "full"],
                                                "use_distributed_optimizer": True}})
    assert space.choices["recompute_granularity"] == (None, "full")
    assert space.choices["use_distributed_optimizer"] == (True,)
    assert "use_distributed_optimizer" not in space.searched


def one_line_error(data) -> str:
    with pytest.raises(ConfigError) as info:
        space = space_from_dict(data, source="bad.yaml")
        check_space(space)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("data, expected", [
    ({**BASE, "sampler": "tpe"}, "unknown"),
    ({**BASE, "layout": {"tensor_parallel": [1, 2]}}, "unknown"),
    ({"model": "gpt3-175b", "cluster": "a100-80gb"}, "missing required key"),
    ({**BASE, "layout": {"tensor_model_parallel_size": [0, 8]}}, "`tensor_model_parallel_size > 0` must hold"),
    ({**BASE, "layout": {"recompute_granularity": ["sometimes"]}}, "`recompute_granularity` must be one of"),
    ({**BASE, "layout": {"sequence_parallel": ["yes"]}}, "takes true or false"),
    ({**BASE, "layout": {"micro_batch_size": [1.5]}}, "must be an integer"),
    ({**BASE, "layout": {"micro_batch_size": []}}, "list of values is empty"),
    ({**BASE, "layout": {"num_layers_per_virtual_pipeline_stage": "auto"}}, "is not supported"),
    ({**BASE, "global_batch_size": -8}, "`global_batch_size > 0` must hold"),
    ({**BASE, "objectives": ["speed"]}, "`objectives` must be distinct names"),
    ({**BASE, "objectives": ["step_time", "num_gpus"]}, "needs `num_gpus` to list several"),
    ({**BASE, "model": "gpt-9000"}, "unknown model preset"),
    ({**BASE, "layout": {"tensor_model_parallel_size": [5, 7]}}, "holds no valid layout"),
])
def test_bad_spaces_fail_in_one_line(data, expected):
    assert expected in one_line_error(data)


def test_empty_space_names_the_rule():
    message = one_line_error({**BASE, "model": "llama3-70b", "num_gpus": 96,
                              "layout": {"tensor_model_parallel_size": [3]}})
    assert "num_attention_heads % tensor_model_parallel_size == 0" in message


def test_model_file_relative_to_the_space(tmp_path):
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump({"num_layers": 4, "hidden_size": 256,
                                                         "num_attention_heads": 4, "seq_length": 128,
                                                         "vocab_size": 1000}))
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({"model": "tiny.yaml", "cluster": "a100-80gb",
                                                          "num_gpus": 8, "global_batch_size": 16}))
    space = load_space(tmp_path / "space.yaml")
    assert space.model.num_layers == 4 and space.name == "space"


def test_auto_caps_micro_batch_and_context_parallel():
    space = space_from_dict({**BASE, "model": "llama3-70b", "num_gpus": 1024, "global_batch_size": 1024,
                             "layout": {"micro_batch_size": "auto", "context_parallel_size": "auto"}})
    assert space.choices["micro_batch_size"] == (1, 2, 4, 8)  # not up to 1024
    assert space.choices["context_parallel_size"] == (1, 2, 4, 8)  # not up to 64; 8192 / 8 = 1024 tokens per rank
    listed = space_from_dict({**BASE, "global_batch_size": 1024, "layout": {"micro_batch_size": [16, 32]}})
    assert listed.choices["micro_batch_size"] == (16, 32)  # listed values are taken as they are
