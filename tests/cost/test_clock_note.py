"""A GPU whose sustained clock under load is not measured: every report says at which clock its compute runs (the
peak's, for want of any; GB200's, derived from its runs beside B200's) and how to give a measured one; none does
for a measured clock or one the user gives."""

from __future__ import annotations

import json

import pytest

import yaml

from echo_tune.cli.main import main
from echo_tune.config.specs.cluster import clock_note
from echo_tune.config.load.loading import load_cluster, load_gpu
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.sim.simulate import simulate

MODEL = ModelSpec(name="tiny", num_layers=4, hidden_size=1024, num_attention_heads=8, ffn_hidden_size=4096,
                  vocab_size=32000, seq_length=2048)
LAYOUT = ParallelConfig(global_batch_size=16, micro_batch_size=1)
GIVEN = "--gpu-clock-mhz"  # every clock note names how to give the clock


def test_notes_by_what_is_known_of_the_clock():
    assert clock_note(load_gpu("b200")) is None and clock_note(load_gpu("h100-sxm")) is None  # measured
    gb200 = load_gpu("gb200")
    derived = clock_note(gb200)
    assert "1,620 MHz" in derived and "derived from four published runs" in derived and GIVEN in derived
    gb300 = load_gpu("gb300")  # B200's clock scaled by power per SM (tests/cost/test_power_clock.py)
    assert "1,834 MHz" in clock_note(gb300) and "power per SM" in clock_note(gb300)
    unknown = clock_note(gb200.replace(sustained_clock_mhz=None, sustained_clock_derived_from=None))
    assert "2,062 MHz its peak" in unknown and GIVEN in unknown and "sustained_clock_mhz" in unknown


@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_simulate_says_it_and_a_given_clock_silences_it():
    gb200 = load_cluster("gb200-nvl72")
    report = simulate(MODEL, gb200, 8, LAYOUT)
    assert clock_note(gb200.gpu) in report.notes
    for clock in (1700, gb200.gpu.sustained_clock_mhz):  # given, even equal to the derived one: no note
        assert not any(GIVEN in n for n in simulate(MODEL, gb200.replace(sustained_clock_mhz=clock), 8, LAYOUT).notes)
    at_peak = gb200.replace(gpu=gb200.gpu.replace(sustained_clock_mhz=None, sustained_clock_derived_from=None))
    peak_report = simulate(MODEL, at_peak, 8, LAYOUT)
    assert clock_note(at_peak.gpu) in peak_report.notes
    assert report.step_time_s > peak_report.step_time_s  # the derived clock is below the peak's: slower compute
    assert not any(GIVEN in n for n in simulate(MODEL, load_cluster("b200"), 8, LAYOUT).notes)


def test_search_and_rank_say_it_once(tmp_path, capsys):
    model = {"name": "tiny", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8,
             "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_length": 2048}
    assert main(["search", "--model", "llama3-8b", "--cluster", "gb200-nvl72", "--num-gpus", "8",
                 "--global-batch-size", "16", "--n-trials", "3", "--results-dir", str(tmp_path), "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert sum(GIVEN in n for n in notes) == 1
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
    assert capsys.readouterr().out.count("a sustained clock not measured on it") == 1
