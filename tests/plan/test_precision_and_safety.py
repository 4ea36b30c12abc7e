"""`plan` searches FP8 where asked and says which precision won; near-ties with more memory free are named;
an infeasible candidate says what would fit."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from echo_tune.errors import ConfigError
from echo_tune.plan.planner import PlanOptions, parse_candidate, plan, precision_of
from echo_tune.plan.safety import NEAR_TIE_MIN_EXTRA_GIB, fit_hint_text, near_tie
from echo_tune.search.space.auto_space import auto_space_dict

DATA = Path(__file__).resolve().parents[1] / "data"
MODEL = str(DATA / "tiny-llama.yaml")
GIB = 2**30


@pytest.fixture
def fp8_cluster(tmp_path):
    data = yaml.safe_load((DATA / "cpu-cluster.yaml").read_text())
    data["gpu"] = {**data["gpu"], "name": "cpu-fp8", "peak_fp8_tflops": 0.2}
    path = tmp_path / "fp8.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_candidate_precision_words():
    c = parse_candidate("h100:256:2.49:fp8")
    assert (c.fp8_format, c.gpu_hour_price, c.num_gpus, c.name) == ("auto", 2.49, 256, "256 x h100 fp8")
    assert parse_candidate("h100:256:bf16").fp8_format == "none" and parse_candidate("h100:256").fp8_format is None
    assert parse_candidate("b200:64:5:e4m3").fp8_format == "e4m3"
    with pytest.raises(ConfigError, match="has no FP8 tensor cores"):
        parse_candidate("a100-80gb:512:1.29:fp8")
    with pytest.raises(ConfigError, match="PRECISION"):
        parse_candidate("h100:256:2.49:fp16")


def test_fp8_format_of_a_zero_yaml_space():
    assert "fp8_format" not in auto_space_dict("llama3.1-8b", "h100", 8, 16)["layout"]
    auto = auto_space_dict("llama3.1-8b", "h100", 8, 16, fp8_format="auto")
    assert auto["layout"]["fp8_format"] == "auto" and "fp8auto" in auto["name"]
    assert auto_space_dict("llama3.1-8b", "h100", 8, 16, fp8_format="e4m3")["layout"]["fp8_format"] == "e4m3"
    assert "fp8_format" not in auto_space_dict("llama3.1-8b", "a100-80gb", 8, 16, fp8_format="auto")["layout"]
    with pytest.raises(ConfigError, match="FP8 tensor cores"):
        auto_space_dict("llama3.1-8b", "a100-80gb", 8, 16, fp8_format="hybrid")
    with pytest.raises(ConfigError, match="must be one of"):
        auto_space_dict("llama3.1-8b", "h100", 8, 16, fp8_format="fp4")


def test_plan_searches_fp8_and_reports_the_precision_that_won(tmp_path, fp8_cluster):
    cands = [parse_candidate(f"{fp8_cluster}:8:2.0:fp8"), parse_candidate(f"{DATA / 'cpu-cluster.yaml'}:8:1.0")]
    result = plan(MODEL, cands, PlanOptions(tokens=1e9, global_batch_size=8, n_trials=16, results_dir=tmp_path,
                                            memory_headroom_gib=0.0))
    rows = {r["candidate"]: r for r in result.rows}
    fp8_row, bf16_row = rows[cands[0].name], rows[cands[1].name]
    assert fp8_row["precision_searched"] == "bf16+fp8" and bf16_row["precision_searched"] == "bf16"
    searched = {precision_of(r["config"]) for r in result.records[cands[0].name]}
    assert searched == {"bf16", "fp8 hybrid"}  # both precisions were simulated
    best = min((r for r in result.records[cands[0].name] if r["fits_memory"]), key=lambda r: r["step_time_s"])
    assert fp8_row["precision"] == precision_of(best["config"])
    assert bf16_row["precision"] == "bf16"
    assert "plan-tiny-llama-8xfp8-gbs8-fp8auto-" in fp8_row["study"]


def _rec(step, free_gib, tp=1, cap_gib=80.0):
    return {"fits_memory": free_gib >= 0, "step_time_s": step, "config": {"tensor_model_parallel_size": tp},
            "derived": {"data_parallel_size": 8}, "memory_capacity_bytes": int(cap_gib * GIB),
            "peak_memory_bytes": int((cap_gib - free_gib) * GIB)}


def test_near_tie_names_the_roomier_layout_within_the_margin():
    records = [_rec(10.0, 0.0, tp=1), _rec(10.2, 20.0, tp=2), _rec(10.5, 40.0, tp=4), _rec(9.0, -1.0, tp=8)]
    tie = near_tie(records, 3.0)
    assert tie["config"]["tensor_model_parallel_size"] == 2  # 2% slower; TP4 is 5% slower, TP8 does not fit
    assert tie["slower_pct"] == pytest.approx(2.0) and tie["free_gib"] == pytest.approx(20.0, abs=0.01)
    assert tie["winner_peak_gib"] == pytest.approx(80.0) and tie["limit_gib"] == pytest.approx(80.0)
    assert near_tie(records, 6.0)["config"]["tensor_model_parallel_size"] == 4
    assert near_tie(records, 1.0) is None  # nothing close enough
    assert near_tie([_rec(10.0, 1.0), _rec(10.1, 1.0 + NEAR_TIE_MIN_EXTRA_GIB / 2)], 3.0) is None  # not much more
    with pytest.raises(ConfigError, match="near-tie-pct"):
        near_tie(records, -1)


def test_infeasible_candidate_says_what_would_fit(tmp_path):
    big = yaml.safe_load((DATA / "cpu-cluster.yaml").read_text())
    # one GPU of 1.04 GiB: every layout of the tiny model peaks above it (runtime reserve included)
    small = {**big, "gpu": {**big["gpu"], "name": "cpu-small", "memory_bytes": int(1.04 * GIB)}}
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    result = plan(MODEL, [parse_candidate(f"{tmp_path / 'small.yaml'}:1:1.0")],
                  PlanOptions(tokens=1e9, global_batch_size=8, sampler="exhaustive", results_dir=tmp_path / "r",
                              memory_headroom_gib=0.0))
    row = result.rows[0]
    assert not row["feasible"]
    hint = row["fit_hint"]
    assert hint["need_gib"] > hint["limit_gib"]
    assert "a100-40gb" in hint["parts"]  # every preset GPU holds a tiny model's layout
    text = fit_hint_text(hint, row["gpu"])
    assert "\n" not in text and len(text) < 300
    more = hint["more_gpus"]  # re-simulated on more GPUs of this part: it fits there
    assert more["num_gpus"] in (2, 4, 8) and more["peak_gib"] <= hint["limit_gib"] < hint["need_gib"]
    assert f"{more['num_gpus']} x cpu-small" in text


def test_plan_notes_a_bf16_only_search_on_an_fp8_gpu_unless_asked(tmp_path, fp8_cluster):
    opts = PlanOptions(tokens=1e9, global_batch_size=8, n_trials=4, results_dir=tmp_path, memory_headroom_gib=0.0)
    plain = plan(MODEL, [parse_candidate(f"{fp8_cluster}:8")], opts)
    assert any("searched in BF16 only" in n for n in plain.notes)
    asked = plan(MODEL, [parse_candidate(f"{fp8_cluster}:8:bf16")], opts)
    assert not any("searched in BF16 only" in n for n in asked.notes)
