"""A Hugging Face config.json as the model of `echo-tune simulate --model` and of a `rank` candidate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import yaml

from echo_tune.cli.main import main

HF = Path(__file__).resolve().parents[1] / "config" / "data" / "hf"  # sources: tests/config/data/hf/SOURCES.md
QWEN = {"hidden_size": 3584, "num_layers": 28, "num_attention_heads": 28, "num_query_groups": 4,
        "ffn_hidden_size": 18944, "vocab_size": 152064}  # Qwen/Qwen2.5-7B config.json
LAYOUT = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 2, "global_batch_size": 64,
          "micro_batch_size": 1, "use_distributed_optimizer": True, "recompute_granularity": "full"}


def out_json(capsys, argv) -> dict | list:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_simulate_with_a_config_json(tmp_path, capsys, monkeypatch):
    shutil.copy(HF / "qwen2.5-7b.json", tmp_path / "config.json")
    monkeypatch.chdir(tmp_path)
    flags = ["--cluster", "h100", "--num-gpus", "16", "--tensor-model-parallel-size", "2",
             "--global-batch-size", "64", "--seq-length", "4096", "--json"]
    report = out_json(capsys, ["simulate", "--model", "config.json", *flags])
    spec = report["config"]["model_spec"]
    assert {k: spec[k] for k in QWEN} == QWEN and spec["seq_length"] == 4096
    # the same numbers as the same model written out as a YAML file of Megatron names
    (tmp_path / "same.yaml").write_text(yaml.safe_dump({k: v for k, v in spec.items() if k != "name"}))
    assert out_json(capsys, ["simulate", "--model", "same.yaml", *flags])["step_time_s"] == report["step_time_s"]


def test_seq_length_flag_reaches_the_sliding_window(tmp_path, capsys):
    model = str(HF / "mistral-7b-v0.1.json")  # sliding_window 4096, max_position_embeddings 32768
    flags = ["--cluster", "h100", "--num-gpus", "16", "--global-batch-size", "64", "--json"]
    short = out_json(capsys, ["simulate", "--model", model, "--seq-length", "4096", *flags])
    assert short["config"]["model_spec"]["window_size"] is None  # the window covers the sequence
    long = out_json(capsys, ["simulate", "--model", model, "--seq-length", "8192", *flags])
    assert list(long["config"]["model_spec"]["window_size"]) == [4096, 0]
    assert any("sliding window 4096" in n for n in long["notes"])


def test_rank_candidate_with_a_config_json(tmp_path, capsys, monkeypatch):
    (tmp_path / "hf").mkdir()
    for name in ("qwen2.5-7b.json", "mistral-7b-v0.1.json"):
        shutil.copy(HF / name, tmp_path / "hf" / name)
    rank = tmp_path / "rank.yaml"
    rank.write_text(yaml.safe_dump({"tokens": 1e11, "candidates": [
        {"name": "qwen", "model": {"from": "hf/qwen2.5-7b.json", "seq_length": 4096}, "cluster": "h100", "num_gpus": 16, "gpu_hour_cost": 2.0,
         "layout": LAYOUT},
        # at 32768 tokens, Mistral's 4096-token sliding window is --window-size 4096,0
        {"name": "mistral", "model": {"from": "hf/mistral-7b-v0.1.json", "seq_length": 32768}, "cluster": "h100", "num_gpus": 16,
         "layout": LAYOUT}]}))
    monkeypatch.chdir(tmp_path / "hf")  # paths in a rank file are taken relative to it
    rows = {r["name"]: r for r in out_json(capsys, ["rank", str(rank), "--json"])}
    qwen = rows["qwen"]["config"]["model_spec"]
    assert {k: qwen[k] for k in QWEN} == QWEN and rows["qwen"]["step_time_s"] > 0
    assert list(rows["mistral"]["config"]["model_spec"]["window_size"]) == [4096, 0]
    assert rows["mistral"].get("refused") is None


def test_rank_bare_config_json_name_beside_the_rank_file(tmp_path, capsys, monkeypatch):
    shutil.copy(HF / "qwen2.5-7b.json", tmp_path / "config.json")
    rank = tmp_path / "rank.yaml"
    rank.write_text(yaml.safe_dump({"candidates": [
        {"name": "qwen", "model": {"from": "config.json", "seq_length": 4096}, "cluster": "h100", "num_gpus": 16,
         "layout": LAYOUT}]}))
    monkeypatch.chdir(tmp_path.parent)
    assert main(["rank", str(rank), "--json"]) == 0


def test_config_json_without_a_training_length_needs_seq_length(tmp_path, capsys):
    """issue 20 item 2: no silent max_position_embeddings (131072 for Qwen2.5); exit 2, one line naming it."""
    model = str(HF / "qwen2.5-7b.json")
    code = main(["search", "--model", model, "--cluster", "h100", "--num-gpus", "16", "--global-batch-size", "64",
                 "--n-trials", "1", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--seq-length" in err, err
    assert main(["simulate", "--model", model, "--cluster", "h100", "--num-gpus", "16",
                 "--global-batch-size", "64"]) == 2
    assert "--seq-length" in capsys.readouterr().err


def test_every_command_header_states_the_sequence_length(tmp_path, capsys):
    """issue 20 item 2: the length trained, and what reading the config.json assumed, head the output."""
    model = str(HF / "llama-3.1-70b.json")
    assert main(["simulate", "--model", model, "--cluster", "h100", "--num-gpus", "64", "--global-batch-size", "64",
                 "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "4"]) == 0
    out = capsys.readouterr().out
    assert "8,192-token sequences" in out.splitlines()[0] and "original_max_position_embeddings" in out
    assert main(["simulate", "--model", model, "--cluster", "h100", "--num-gpus", "64", "--global-batch-size", "64",
                 "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "4", "--json"]) == 0
    assert any("original_max_position_embeddings" in n for n in json.loads(capsys.readouterr().out)["notes"])
    rank = tmp_path / "rank.yaml"
    rank.write_text(yaml.safe_dump({"tokens": 1e11, "candidates": [
        {"name": "qwen", "model": {"from": str(HF / "qwen2.5-7b.json"), "seq_length": 2048}, "cluster": "h100",
         "num_gpus": 16, "layout": LAYOUT}]}))
    assert main(["rank", str(rank)]) == 0
    assert "seq_length 2,048" in capsys.readouterr().out
