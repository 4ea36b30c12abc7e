"""Zero-YAML search and plan search any dimension a space file can: --fp8-format and --layout FIELD=VALUES."""

import json
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.errors import ConfigError
from echo_tune.results_api import load_results
from echo_tune.search.space.auto_space import auto_space, layout_overrides

DATA = Path(__file__).resolve().parents[1] / "data"
MODEL = str(DATA / "tiny-llama.yaml")
CLUSTER = str(DATA / "cpu-cluster.yaml")


def test_layout_overrides_read_values_as_a_space_file_does():
    assert layout_overrides(["recompute_method=auto", "recompute_num_layers=1,2", "tp-comm-overlap=true",
                             "recompute_granularity=full"]) == {
        "recompute_method": "auto", "recompute_num_layers": [1, 2], "tp_comm_overlap": True,
        "recompute_granularity": "full"}
    with pytest.raises(ConfigError, match="searched setting"):
        layout_overrides(["hidden_size=4"])
    with pytest.raises(ConfigError, match="FIELD=VALUES"):
        layout_overrides(["recompute_method"])


def test_layout_overrides_replace_the_built_values_and_name_their_own_study():
    plain = auto_space(MODEL, CLUSTER, 8, 8)
    space = auto_space(MODEL, CLUSTER, 8, 8, layout=layout_overrides(
        ["recompute_granularity=full", "recompute_method=auto", "recompute_num_layers=1,2"]))
    assert plain.choices["recompute_method"] == (None,) or len(plain.choices["recompute_method"]) == 1
    assert space.choices["recompute_granularity"] == ("full",)
    assert set(space.choices["recompute_method"]) == {"uniform", "block"}
    assert space.choices["recompute_num_layers"] == (1, 2)
    assert space.name != plain.name  # a resumed study never mixes two spaces


def test_search_cli_searches_fp8_and_layout_values(tmp_path, capsys):
    data = yaml.safe_load((DATA / "cpu-cluster.yaml").read_text())
    data["gpu"] = {**data["gpu"], "name": "cpu-fp8", "peak_fp8_tflops": 0.2}
    (tmp_path / "fp8.yaml").write_text(yaml.safe_dump(data))
    assert main(["search", "--model", MODEL, "--cluster", str(tmp_path / "fp8.yaml"), "--num-gpus", "8",
                 "--global-batch-size", "8", "--fp8-format", "auto", "--layout", "recompute_granularity=full",
                 "--layout", "recompute_method=auto", "--sampler", "exhaustive", "--results-dir",
                 str(tmp_path / "r"), "--format", "json", "--no-explain"]) == 0
    out = json.loads(capsys.readouterr().out)
    df = load_results(out["results_dir"])
    assert set(df["fp8_format"]) == {"none", "hybrid"}
    assert set(df["recompute_method"]) == {"uniform", "block"} and set(df["recompute_granularity"]) == {"full"}
    # a fixed FP8 format on a GPU without FP8: one line, before any trial
    assert main(["search", "--model", MODEL, "--cluster", CLUSTER, "--num-gpus", "8", "--global-batch-size", "8",
                 "--fp8-format", "hybrid", "--results-dir", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err
    assert "FP8 tensor cores" in err and len(err.strip().splitlines()) == 1


def test_search_with_no_fit_says_what_would_fit(tmp_path, capsys):
    data = yaml.safe_load((DATA / "cpu-cluster.yaml").read_text())
    data["gpu"] = {**data["gpu"], "name": "cpu-small", "memory_bytes": int(1.04 * 2**30)}
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(data))
    assert main(["search", "--model", MODEL, "--cluster", str(tmp_path / "small.yaml"), "--num-gpus", "1",
                 "--global-batch-size", "8", "--sampler", "exhaustive", "--memory-headroom-gib", "0",
                 "--results-dir", str(tmp_path / "r"), "--json"]) == 1
    hint = json.loads(capsys.readouterr().out)["closest_miss"]["fit_hint"]
    assert hint["more_gpus"]["num_gpus"] > 1 and "a100-40gb" in hint["parts"]


def test_search_names_a_near_tie_with_more_memory_free(tmp_path, capsys):
    assert main(["search", "--model", "llama3.1-8b", "--cluster", "h100", "--num-gpus", "8", "--global-batch-size",
                 "64", "--n-trials", "12", "--results-dir", str(tmp_path), "--no-explain", "--near-tie-pct", "100",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    tie, best = out["near_tie"], out["best"]
    assert 0 <= tie["slower_pct"] <= 100 and tie["step_time_s"] >= best["step_time_s"]
    assert tie["free_gib"] >= tie["winner_free_gib"] + 4
    assert tie["winner_peak_gib"] == pytest.approx(best["peak_memory_bytes"] / 2**30)
