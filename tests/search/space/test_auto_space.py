"""Zero-YAML spaces: built from model, cluster, GPUs and batch, with stated caps; --write-space round-trips."""

import json
from pathlib import Path

import pytest

from echo_tune.cli.main import main
from echo_tune.search.space.auto_space import MAX_CONTEXT_PARALLEL, MAX_MICRO_BATCH, auto_space, auto_space_dict
from echo_tune.search.space.search_space import load_space

HF = Path(__file__).resolve().parents[2] / "config" / "data" / "hf"


def test_caps_on_micro_batch_and_context_parallel():
    space = auto_space("llama3.1-8b", "h100", 64, 512)
    assert max(space.choices["micro_batch_size"]) == MAX_MICRO_BATCH
    assert all(512 % m == 0 for m in space.choices["micro_batch_size"])
    cps = space.choices["context_parallel_size"]
    assert max(cps) <= MAX_CONTEXT_PARALLEL and all(8192 // c >= 1024 for c in cps)
    assert set(space.choices["tensor_model_parallel_size"]) <= {1, 2, 4, 8}
    assert space.choices["use_distributed_optimizer"] == (True,)
    assert space.choices["expert_model_parallel_size"] == (1,)


def test_short_sequence_limits_cp_and_moe_gets_ep():
    space = auto_space("mixtral-8x7b", "h100", 64, 256)
    assert max(space.choices["context_parallel_size"]) == 4  # 4096 tokens, >= 1024 per CP rank
    assert set(space.choices["expert_model_parallel_size"]) == {1, 2, 4, 8}


def test_write_space_round_trips_and_config_json_model(tmp_path):
    out = tmp_path / "sub" / "space.yaml"
    assert main(["search", "--model", str(HF / "llama-3.1-70b.json"), "--cluster", "h100", "--num-gpus", "64",
                 "--global-batch-size", "128", "--write-space", str(out), "--n-trials", "3", "--no-baselines",
                 "--results-dir", str(tmp_path / "r"), "--json"]) in (0, 1)
    space = load_space(out)
    assert space.model.hidden_size == 8192 and space.name == "llama-3.1-70b-64xh100"
    assert space.choices == auto_space(str(HF / "llama-3.1-70b.json"), "h100", 64, 128).choices
    assert "micro-batch 1-8" in out.read_text()


def test_missing_pieces_and_both_given_are_one_line_errors(capsys, tmp_path):
    assert main(["search", "--model", "llama3.1-8b", "--cluster", "h100", "--num-gpus", "8"]) == 2
    assert "--global-batch-size is missing" in capsys.readouterr().err
    space = tmp_path / "s.yaml"
    space.write_text(json.dumps(auto_space_dict("llama3.1-8b", "h100", 8, 16)))
    assert main(["search", str(space), "--model", "llama3.1-8b"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["search", "--model", "llama3.1-8b", "--cluster", "h100", "--num-gpus", "0",
                 "--global-batch-size", "8"]) == 2


def test_random_sampler_stops_when_every_layout_is_simulated(tmp_path):
    from echo_tune.search.space.space_check import check_space
    from echo_tune.search.space.search_space import load_space
    from echo_tune.search.study import SearchOptions, run_search

    space = load_space(Path(__file__).resolve().parents[2] / "data" / "tiny-space.yaml")
    valid, _ = check_space(space)
    result = run_search(space, SearchOptions(sampler="random", n_trials=10_000, results_dir=tmp_path))
    assert result.n_trials == len(valid)
    assert result.n_feasible + result.n_infeasible == len(valid)  # each layout once, none repeated


def test_search_json_carries_the_explanation(tmp_path, capsys):
    space = Path(__file__).resolve().parents[3] / "search_spaces" / "small-gpt7b-16xa100.yaml"
    assert main(["search", str(space), "--n-trials", "40", "--results-dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["best"]["error_band"]["mean_abs_error_pct"] > 0 and data["best"]["error_band"]["family"]
    ex = data["explanation"]
    assert ex["families"][0]["step_time_s"] == pytest.approx(data["best"]["step_time_s"])
    fams = [f["family"] for f in ex["families"]]
    assert len(set(fams)) == len(fams)  # one row per TP x PP x CP family
    assert [s["assumption"] for s in ex["sensitivity"]][:2] == ["as modelled", "tp_comm_overlap off"]
    assert ex["sensitivity"][0]["step_time_s"][0] == pytest.approx(data["best"]["step_time_s"])
    labels = [f["label"] for f in ex["families"]]
    assert len(set(labels)) == len(labels)


def test_no_fit_names_the_closest_miss(tmp_path, capsys):
    assert main(["search", "--model", "llama3.1-70b", "--cluster", "a100-40gb", "--num-gpus", "8",
                 "--global-batch-size", "8", "--n-trials", "15", "--results-dir", str(tmp_path), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["best"] is None and data["closest_miss"]["over_gib"] > 0
    assert data["closest_miss"]["layout"].startswith("TP")


def test_seq_length_override_is_written_into_the_space(tmp_path):
    data = auto_space_dict(str(HF / "llama-3.1-70b.json"), "h100", 64, 128, seq_length=4096)
    assert isinstance(data["model"], dict) and data["model"]["seq_length"] == 4096 and "seq4096" in data["name"]
    space = auto_space(str(HF / "llama-3.1-70b.json"), "h100", 64, 128, seq_length=4096)
    assert space.model.seq_length == 4096 and max(space.choices["context_parallel_size"]) == 4
    # Mistral 7B v0.1: window 4096 < 8192 tokens: --window-size 4096,0 on every layer
    assert list(auto_space_dict(str(HF / "mistral-7b-v0.1.json"), "h100", 8, 8, seq_length=8192)["model"]
                ["window_size"]) == [4096, 0]
    assert auto_space_dict(str(HF / "mistral-7b-v0.1.json"), "h100", 8, 8, seq_length=4096)["model"]["seq_length"] == 4096


def test_a_model_without_flash_style_attention_searches_no_context_parallelism():
    # TransformerEngine refuses CP on unfused attention (the gpt3 presets run it): such layouts cannot launch
    from echo_tune.search.space.auto_space import auto_space_dict

    assert auto_space_dict("gpt3-175b", "h100", 128, 256)["layout"]["context_parallel_size"] == [1]
    assert len(auto_space_dict("llama3.1-70b", "h100", 128, 256)["layout"]["context_parallel_size"]) > 1
