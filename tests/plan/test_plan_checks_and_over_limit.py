"""`plan` checks every candidate before searching any (a bad one is a row with its reason), and a layout over its
memory limit by less than the memory model's over-prediction is "at risk" with its throughput (plan and rank)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.errors import ConfigError
from echo_tune.plan.planner import PlanOptions, parse_candidate, parse_candidates, plan
from echo_tune.sim.memory.memory_band import PEAK_OVER_PREDICTION, over_limit_risk
from echo_tune.search.outputs.results import entry

DATA = Path(__file__).resolve().parents[1] / "data"
MODEL = str(DATA / "tiny-llama.yaml")
CPU = str(DATA / "cpu-cluster.yaml")
GIB = 2**30


def _opts(tmp_path, **kw):
    return PlanOptions(tokens=1e9, global_batch_size=8, n_trials=6, results_dir=tmp_path / "r",
                       memory_headroom_gib=0.0, **kw)


def test_a_bad_candidate_is_a_row_and_the_others_are_planned(tmp_path):
    """With --fp8-format hybrid the CPU part (no FP8 tensor cores) cannot be searched unless it says bf16: the old
    planner searched the first candidate, then aborted the whole comparison on the second."""
    searched = []
    good, bad = parse_candidate(f"{CPU}:4:1.0:bf16"), parse_candidate(f"{CPU}:8:2.0")
    result = plan(MODEL, [good, bad], _opts(tmp_path, fp8_format="hybrid"),
                  progress=lambda name, *_: searched.append(name))
    assert set(searched) == {good.name}
    rows = {r["candidate"]: r for r in result.rows}
    assert rows[good.name]["feasible"] and rows[good.name]["step_time_s"] > 0
    assert not rows[bad.name]["feasible"] and rows[bad.name]["error"].startswith("invalid: ")
    assert "FP8" in rows[bad.name]["error"] and rows[bad.name]["step_time_s"] is None
    assert result.rows[-1] is rows[bad.name] and result.winner is rows[good.name]
    assert any("1 of 2 candidates could not be planned" in n and "exit code is 0" in n for n in result.notes)


def test_no_candidate_that_can_be_planned_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"^no candidate can be planned: .*FP8") as info:
        plan(MODEL, [parse_candidate(f"{CPU}:8:2.0")], _opts(tmp_path, fp8_format="hybrid"))
    assert "\n" not in str(info.value)


def test_unreadable_candidates_are_rows_too():
    good, bad = parse_candidates([f"{CPU}:4", "nope:8", "h100:x"])
    assert [c.num_gpus for c in good] == [4]
    assert [r["candidate"] for r in bad] == ["nope:8", "h100:x"]
    assert all(r["error"].startswith("invalid: ") and not r["feasible"] for r in bad)


def test_cli_plans_the_good_candidates_and_exits_0(tmp_path, capsys):
    args = ["plan", "--model", MODEL, "--tokens", "1e9", "--global-batch-size", "8", "--n-trials", "4",
            "--memory-headroom-gib", "0", "--results-dir", str(tmp_path), "--no-explain",
            "--candidate", "nope:8", "--candidate", f"{CPU}:4:1.0"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "nope:8 not planned: invalid: unknown cluster" in " ".join(out.split())
    assert "1 of 2 candidates could not be planned" in " ".join(out.split())
    assert main(args + ["--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[0]["feasible"] and rows[1]["candidate"] == "nope:8" and rows[1]["error"]
    assert main(args[:-4] + ["--candidate", "nope:8", "--candidate", "h100:x"]) == 2
    assert "no candidate can be planned: nope:8: invalid:" in capsys.readouterr().err


def test_over_limit_risk_is_the_measured_over_prediction():
    peak, reserve = 76 * GIB, GIB
    margin = PEAK_OVER_PREDICTION * (peak - reserve)
    assert over_limit_risk(peak, reserve, peak + 1) is None  # fits as predicted: memory_band's business
    assert "0.10 GiB over its" in over_limit_risk(peak, reserve, int(peak - 0.1 * GIB))
    assert over_limit_risk(peak, reserve, int(peak - margin) + 1) is not None
    assert over_limit_risk(peak, reserve, int(peak - margin) - 1) is None


def _cluster_with_memory(tmp_path, memory_bytes: int, name: str) -> str:
    data = yaml.safe_load(Path(CPU).read_text())
    data["gpu"] = {**data["gpu"], "name": name, "memory_bytes": int(memory_bytes)}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _lightest_roomy_layout(tmp_path):
    """(the exhaustive plan options without recompute, the lightest layout of the roomy CPU cluster, its stage reserve
    bytes): what the tests below size a tight cluster's memory from."""
    opts = _opts(tmp_path, sampler="exhaustive", layout={"recompute_granularity": ["none"]})
    opts.n_trials = None
    roomy = plan(MODEL, [parse_candidate(f"{CPU}:4")], opts)
    (name,) = roomy.records
    low = min(roomy.records[name], key=lambda r: r["peak_memory_bytes"])
    reserve = max(s["reserve_bytes"] for s in entry(roomy.spaces[name], -1, low)["stage_memory_bytes"])
    return opts, low, reserve


def test_plan_shows_a_layout_just_over_its_limit_at_risk_with_its_throughput(tmp_path):
    # no recompute in the space: the search skips the recompute variants of a layout that fits (search/space/dominance.py),
    # so the roomy run's lowest peak would not be the tight run's
    opts, low, reserve = _lightest_roomy_layout(tmp_path)
    margin = PEAK_OVER_PREDICTION * (low["peak_memory_bytes"] - reserve)  # of the allocator bytes
    just = _cluster_with_memory(tmp_path, low["peak_memory_bytes"] - 0.5 * margin, "just-over")
    far = _cluster_with_memory(tmp_path, low["peak_memory_bytes"] - 0.05 * low["peak_memory_bytes"], "far-over")
    result = plan(MODEL, [parse_candidate(f"{just}:4:1.0"), parse_candidate(f"{far}:4:1.0")], opts)
    rows = {Path(r["candidate"].split(" x ")[1]).stem: r for r in result.rows}
    at_risk, over = rows["just-over"], rows["far-over"]
    assert at_risk["feasible"] and at_risk["over_limit_at_risk"] and at_risk["memory_band"] == "at risk"
    assert at_risk["tokens_per_s"] > 0 and at_risk["days"] > 0 and at_risk["cost"] > 0
    assert "over its" in at_risk["memory_verdict"] and "one in twenty" in at_risk["memory_verdict"]
    assert not over["feasible"] and over["tokens_per_s"] is None and over["closest_miss"]["over_gib"] > 0
    assert result.winner is at_risk


def test_rank_shows_nvidia_s_llama3_8b_fp8_script_at_risk_when_just_over(tmp_path, capsys):
    """NVIDIA's examples/llama/train_llama3_8b_h100_fp8.sh on 8 H100: with a headroom that leaves it 0.1 GiB over
    the limit, rank gives its time and cost, marked at risk; 3 GiB over, it does not fit (no time)."""
    import echo_tune as et
    from echo_tune.config.launch.megatron_args import parse_megatron_line

    line = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 "
            "--max-position-embeddings 8192 --position-embedding-type rope --attention-dropout 0.0 --hidden-dropout 0.0 "
            "--swiglu --normalization RMSNorm --attention-backend fused --untie-embeddings-and-output-weights "
            "--disable-bias-linear --micro-batch-size 1 --global-batch-size 128 --bf16 --grad-reduce-in-bf16 "
            "--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-param-gather --tensor-model-parallel-size 1 "
            "--context-parallel-size 1 --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce "
            "--overlap-param-gather --vocab-size 128256")
    model, parallel, precision, _ = parse_megatron_line(line)
    cluster = et.load_cluster("h100-sxm")
    report = et.simulate(et.ModelSpec(name="l", **model), cluster,
                         8, et.ParallelConfig(precision=precision, **parallel))
    spare_gib = (cluster.gpu.memory_bytes - report.peak_memory_bytes) / GIB
    path = tmp_path / "rank.yaml"
    path.write_text(yaml.safe_dump({"tokens": 1e11, "candidates": [
        {"name": "llama3-8b-fp8", "cluster": "h100-sxm", "num_gpus": 8, "gpu_hour_cost": 2.5,
         "megatron_args": line}]}))
    assert main(["rank", str(path), "--json", "--memory-headroom-gib", f"{spare_gib + 0.1:.6f}"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert not row["fits_memory"] and row["feasible"] and row["memory_band"] == "at risk"
    assert row["time_to_train_days"] > 0 and row["cost"] > 0 and "0.10 GiB over its" in row["memory_verdict"]
    assert main(["rank", str(path), "--memory-headroom-gib", f"{spare_gib + 0.1:.6f}"]) == 0
    assert "its time and cost hold if it fits" in " ".join(capsys.readouterr().out.split())
    assert main(["rank", str(path), "--json", "--memory-headroom-gib", f"{spare_gib + 3:.6f}"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert not row["feasible"] and row["time_to_train_days"] is None and row["memory_band"] == "does not fit"


def test_plan_without_a_headroom_shows_the_fastest_at_risk_layout_when_none_is_safe(tmp_path):
    """Without --memory-headroom-gib the search counts a layout that fits by less than the memory band's margin as
    not fitting (search/engines/objective.py safe_memory); where no layout is safe, plan shows the fastest at-risk one,
    which fits as predicted, before any over its limit."""
    from echo_tune.sim.memory.memory_band import PEAK_UNDER_PREDICTION

    opts, low, reserve = _lightest_roomy_layout(tmp_path)
    margin = PEAK_UNDER_PREDICTION * (low["peak_memory_bytes"] - reserve)
    tight = _cluster_with_memory(tmp_path, low["peak_memory_bytes"] + 2 * GIB + 0.5 * margin, "tight")  # 2 GiB: default
    opts.memory_headroom_gib = None
    (row,) = plan(MODEL, [parse_candidate(f"{tight}:4:1.0")], opts).rows
    assert row["feasible"] and row["memory_band"] == "at risk" and not row["over_limit_at_risk"]
    assert row["peak_memory_gib"] * GIB <= low["peak_memory_bytes"] + margin and row["tokens_per_s"] > 0


def test_the_winner_is_a_layout_the_search_kept_before_any_fallback():
    from echo_tune.plan.planner import PlanResult

    def row(name, days, **flags):
        return {"candidate": name, "feasible": True, "meets_deadline": None, "within_budget": None, "days": days,
                **flags}

    over = row("over", 1.0, fallback_at_risk=True, over_limit_at_risk=True)
    risky = row("risky", 2.0, fallback_at_risk=True)
    safe = row("safe", 3.0)
    assert PlanResult(model="m", tokens=1, global_batch_size=1, currency="USD", rows=[over, risky, safe]).winner is safe
    assert PlanResult(model="m", tokens=1, global_batch_size=1, currency="USD", rows=[over, risky]).winner is risky
    assert PlanResult(model="m", tokens=1, global_batch_size=1, currency="USD", rows=[over]).winner is over
