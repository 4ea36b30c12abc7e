"""A GPU whose sustained clock under load is unknown (GB200): every report says its compute runs at the clock its
peak is specified at, and how to give the clock; none does once a clock is known."""

from __future__ import annotations

import json

import yaml

from echo_tune.cli.main import main
from echo_tune.config.cluster import clock_note
from echo_tune.config.loading import load_cluster, load_gpu
from echo_tune.config.model import ModelSpec
from echo_tune.config.parallel import ParallelConfig
from echo_tune.sim.simulate import simulate

MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
                  vocab_size=32000, seq_length=2048)
LAYOUT = ParallelConfig(global_batch_size=16, micro_batch_size=1)


def test_note_only_without_a_sustained_clock():
    assert clock_note(load_gpu("b200")) is None and clock_note(load_gpu("h100-sxm")) is None
    note = clock_note(load_gpu("gb200"))
    assert "2,062 MHz" in note and "--gpu-clock-mhz" in note and "sustained_clock_mhz" in note
    assert clock_note(load_gpu("gb200").replace(sustained_clock_mhz=1700)) is None


def test_simulate_says_it_and_a_given_clock_silences_it():
    gb200 = load_cluster("gb200-nvl72")
    report = simulate(MODEL, gb200, 8, LAYOUT)
    assert clock_note(gb200.gpu) in report.notes
    clocked = simulate(MODEL, gb200.replace(sustained_clock_mhz=1700), 8, LAYOUT)
    assert not any("--gpu-clock-mhz" in n for n in clocked.notes)
    assert clocked.step_time_s > report.step_time_s  # the lower clock: slower compute
    assert not any("--gpu-clock-mhz" in n for n in simulate(MODEL, load_cluster("b200"), 8, LAYOUT).notes)


def test_search_and_rank_say_it_once(tmp_path, capsys):
    model = {"name": "tiny", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
             "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_length": 2048}
    assert main(["search", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--num-gpus", "8",
                 "--global-batch-size", "16", "--n-trials", "3", "--results-dir", str(tmp_path), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert sum("--gpu-clock-mhz" in n for n in notes) == 1
    layout = {"global_batch_size": 16, "micro_batch_size": 1}
    path = tmp_path / "rank.yaml"
    path.write_text(yaml.safe_dump({"candidates": [
        {"name": "gb200-a", "model": model, "cluster": "gb200-nvl72", "num_gpus": 8, "layout": layout},
        {"name": "gb200-b", "model": model, "cluster": "gb200-nvl72", "num_gpus": 16, "layout": layout},
        {"name": "b200", "model": model, "cluster": "b200", "num_gpus": 8, "layout": layout}]}))
    assert main(["rank", str(path), "--tokens", "1e9", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["gb200-a"]["clock_note"] == clock_note(load_gpu("gb200")) and rows["b200"]["clock_note"] is None
    assert main(["rank", str(path), "--tokens", "1e9"]) == 0
    assert capsys.readouterr().out.count("no clock it sustains under load is known") == 1
