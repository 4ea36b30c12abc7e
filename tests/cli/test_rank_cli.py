"""`echo-tune rank`: candidates ordered by step time, time and cost to train, pointers to search results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "search_spaces" / "rank" / "gpt3-175b-options.yaml"
LAYOUT = {"global_batch_size": 256, "micro_batch_size": 1, "tensor_model_parallel_size": 2,
          "pipeline_model_parallel_size": 2, "use_distributed_optimizer": True}


def rank_json(capsys, *argv) -> list[dict]:
    assert main(["rank", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def write(tmp_path, data) -> str:
    path = tmp_path / "rank.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_example_ranks_by_step_time(capsys):
    rows = rank_json(capsys, str(EXAMPLE), "--tokens", "1e12")
    assert len(rows) == 5 and [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    fits = [r for r in rows if r["fits_memory"]]
    # fastest first by the expected days shown: the simulator's time x the family's median measured/predicted
    # over the goodput (plan/projection.py); within one family that is the step time's order
    assert [r["time_to_train_days"] for r in fits] == sorted(r["time_to_train_days"] for r in fits)
    for r in fits:
        bias = r["error_band"]["median_measured_over_predicted"]
        assert r["time_to_train_days"] == pytest.approx(r["time_to_train_s"] * bias / 0.9 / 86400)
        lo, hi = r["days_band"]
        assert lo <= r["time_to_train_days"] <= hi and r["goodput"] == 0.9
    assert rows[: len(fits)] == fits  # the ones that do not fit come last
    for r in rows:
        assert {"name", "step_time_s", "tokens_per_s", "mfu", "peak_memory_bytes", "fits_memory", "config",
                "time_to_train_s", "gpu_hours", "cost"} <= set(r)
        if r["fits_memory"]:
            assert r["time_to_train_s"] == pytest.approx(1e12 / r["tokens_per_s"])
            assert r["cost"] == pytest.approx(r["gpu_hours"] * r["gpu_hour_cost"]) and r["currency"] == "USD"
        else:  # a layout that does not fit shows no time and no cost
            assert r["time_to_train_s"] is None and r["cost"] is None and r["gpu_hours"] is None
        assert r["error_band"]["mean_abs_error_pct"] > 0 and "headroom_gib" in r
    assert {r["config"]["cluster"] for r in rows} == {"h800-sxm", "a100-80gb"}


def test_sort_by_cost(capsys):
    rows = rank_json(capsys, str(EXAMPLE), "--tokens", "1e12", "--sort", "cost", "--currency", "EUR")
    fits = [r for r in rows if r["fits_memory"]]
    assert [r["cost"] for r in fits] == sorted(r["cost"] for r in fits)
    assert all(r["currency"] == "EUR" for r in fits)


def test_table_output(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # 13 columns: names fold on an 80-column terminal
    assert main(["rank", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert "fastest first" in out and "H800" in out and "yes" in out


def test_pointer_to_a_search_result(capsys, tmp_path):
    space = REPO / "search_spaces" / "small-gpt7b-16xa100.yaml"
    assert main(["search", str(space), "--n-trials", "15", "--results-dir", str(tmp_path / "results"),
                 "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["best"]
    path = write(tmp_path, {"candidates": [
        {"name": "searched", "from_search": "results/small-gpt7b-16xa100", "gpu_hour_cost": 1.0},
        {"name": "by hand", "model": "gpt-7.5b", "cluster": "a100-40gb", "num_gpus": 16, "layout": LAYOUT}]})
    rows = {r["name"]: r for r in rank_json(capsys, path, "--tokens", "1e9")}
    assert rows["searched"]["step_time_s"] == pytest.approx(best["step_time_s"])
    assert rows["searched"]["config"]["tensor_model_parallel_size"] == best["config"]["tensor_model_parallel_size"]
    assert rows["by hand"]["cost"] is None and rows["by hand"]["gpu_hours"] > 0


@pytest.mark.parametrize("data, expected", [
    ({"candidates": []}, "at least one entry"),
    ({"candidates": [{"name": "x", "cluster": "a100-40gb", "num_gpus": 16, "layout": LAYOUT}]},
     "missing required key 'model'"),
    ({"candidates": [{"name": "x", "model": "gpt-7.5b", "cluster": "a100-40gb", "num_gpus": 16,
                      "layout": {**LAYOUT, "tensor_model_parallel_size": 32}}]}, "candidate 'x'"),
    ({"candidates": [{"name": "x", "model": "gpt-7.5b", "cluster": "a100-40gb", "num_gpus": 16,
                      "layout": LAYOUT, "speed": 3}]}, "unknown candidate 'x' key"),
    ({"candidates": [{"name": "x", "from_search": "nowhere"}]}, "does not exist"),
])
def test_bad_rank_files_exit_2_with_one_line(capsys, tmp_path, data, expected):
    assert main(["rank", write(tmp_path, data)]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1


def test_goodput_and_a_deadline_inside_the_band_is_at_risk(capsys):
    rows = [r for r in rank_json(capsys, str(EXAMPLE), "--tokens", "1e12", "--goodput", "1") if r["fits_memory"]]
    first = rows[0]
    bias = first["error_band"]["median_measured_over_predicted"]
    assert first["time_to_train_days"] == pytest.approx(first["time_to_train_s"] * bias / 86400)  # goodput 1
    lo, hi = first["days_band"]
    lo_cost, hi_cost = first["cost_band"]
    assert lo_cost == pytest.approx(lo * 24 * first["config"]["num_gpus"] * first["gpu_hour_cost"])
    assert hi_cost == pytest.approx(hi * 24 * first["config"]["num_gpus"] * first["gpu_hour_cost"])
    middle = str((lo + hi) / 2)
    again = {r["name"]: r for r in rank_json(capsys, str(EXAMPLE), "--tokens", "1e12", "--goodput", "1",
                                             "--deadline-days", middle)}
    assert again[first["name"]]["deadline"] == "at risk"
    assert main(["rank", str(EXAMPLE), "--goodput", "0"]) == 2
    assert "`0 < --goodput <= 1` must hold" in capsys.readouterr().err


def test_a_layout_that_does_not_fit_shows_no_throughput_or_mfu(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    data = {"tokens": 1e9, "candidates": [{"name": "nofit", "model": "llama3.1-70b", "cluster": "a100-80gb",
                                           "num_gpus": 8, "gpu_hour_cost": 2.0,
                                           "layout": {"global_batch_size": 8, "tensor_model_parallel_size": 8}}]}
    assert main(["rank", write(tmp_path, data)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "nofit" in line)
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells[1] == "nofit" and "no" in cells
    assert cells[4:6] == ["-", "-"]  # tokens/s and MFU (days, GPU-hours and cost too)
    assert cells.count("-") >= 5


def test_nvidias_qwen3_recipes_rank_in_their_measured_order_and_the_host_bound_one_says_so(capsys):
    """search_spaces/rank/qwen3-30b-a3b-h100-recipes.yaml: Megatron-Bridge's Qwen3-30B-A3B recipes for 16 H100, measured
    at 20.99 s (HybridEP, EP overlap), 41.25 s (EP16 all-to-all) and 51.27 s (26.02: PP2 VP12 EP8 DeepEP, FP8 current
    scaling); the last is the one the host carries most of."""
    path = str(REPO / "search_spaces" / "rank" / "qwen3-30b-a3b-h100-recipes.yaml")
    rows = rank_json(capsys, path)
    assert [r["name"].split(",")[0] for r in rows] == ["July 2026", "May 2026", "26.02 recipe"]
    shares = [r["host_share"] for r in rows]
    assert shares[2] > 0.4 and shares[2] > max(shares[:2]) + 0.2
    assert main(["rank", path]) == 0
    out = capsys.readouterr().out
    assert "26.02 recipe, PP2 VP12 EP8 DeepEP, FP8 current scaling: host-bound: the GPU waits on the host for" in \
        " ".join(out.split())
    # the July recipe's EP overlap keeps the host's work for two micro-batches in flight: it waits on the host for
    # ~21% of its step (just over the 20% a report calls host-bound), well under half the 26.02 recipe's share
    assert shares[0] < shares[2] / 2
