"""`echo-tune plan`: the planner's table (infeasible rows without time or cost), sorting, reuse, explanation."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.errors import ConfigError
from echo_tune.search.space.labels import full_label, short_labels
from echo_tune.plan.planner import PlanOptions, parse_candidate, plan, sort_rows

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
DATA = Path(__file__).resolve().parents[1] / "data"
MODEL = str(DATA / "tiny-llama.yaml")


@pytest.fixture
def clusters(tmp_path):
    big = yaml.safe_load((DATA / "cpu-cluster.yaml").read_text())
    small = {**big, "gpu": {**big["gpu"], "name": "cpu-tiny-mem", "memory_bytes": 2**20}}
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(big))
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    return tmp_path / "big.yaml", tmp_path / "small.yaml"


def _plan(tmp_path, clusters, **kw):
    big, small = clusters
    cands = [parse_candidate(f"{big}:8:2.0"), parse_candidate(f"{big}:4:3.0"), parse_candidate(f"{small}:4:0.5")]
    opts = PlanOptions(tokens=1e9, global_batch_size=8, n_trials=12, results_dir=tmp_path / "r",
                       memory_headroom_gib=0.0, **kw)
    return plan(MODEL, cands, opts)


def test_table_prices_feasible_rows_and_leaves_infeasible_without_time_or_cost(tmp_path, clusters):
    result = _plan(tmp_path, clusters)
    assert [r["feasible"] for r in result.rows] == [True, True, False]
    for r in result.rows[:2]:
        # a CPU "cluster" is no GPU the bands validated: no band, so only the goodput (0.9) applies
        days = 1e9 / r["tokens_per_s"] / 86400 / 0.9
        assert r["predicted_days"] == pytest.approx(days * 0.9) and r["goodput"] == 0.9
        assert r["days"] == pytest.approx(days)
        assert r["gpu_hours"] == pytest.approx(days * 24 * r["num_gpus"])
        assert r["cost"] == pytest.approx(r["gpu_hours"] * r["gpu_hour_price"]) and r["currency"] == "USD"
        assert r["error_band"]["match"] == "none" and r["error_band"]["text"] == "-"
        assert r["days_band"] is None and r["cost_band"] is None
    bad = result.rows[2]
    assert bad["days"] is None and bad["cost"] is None and bad["step_time_s"] is None
    assert bad["closest_miss"]["over_gib"] > 0 and "TP" in bad["closest_miss"]["layout"]
    assert result.rows[0]["days"] <= result.rows[1]["days"]
    assert result.winner is result.rows[0]


def test_sort_by_cost_and_deadline_budget_marks(tmp_path, clusters):
    result = _plan(tmp_path, clusters, sort="cost", deadline_days=1e-9, budget=1e9)
    costs = [r["cost"] for r in result.rows if r["feasible"]]
    assert costs == sorted(costs)
    assert all(r["meets_deadline"] is False for r in result.rows if r["feasible"])
    assert all(r["within_budget"] is True for r in result.rows if r["feasible"])
    with pytest.raises(ConfigError, match="--sort"):
        sort_rows(result.rows, "speed")


def test_finished_studies_are_reused(tmp_path, clusters):
    first = _plan(tmp_path, clusters)
    again = _plan(tmp_path, clusters)
    assert [r["step_time_s"] for r in first.rows] == [r["step_time_s"] for r in again.rows]
    assert all(r["n_trials"] == 12 for r in again.rows)


def test_a_new_price_reuses_the_studies_and_prices_the_rows_anew(tmp_path, clusters):
    big, _ = clusters
    opts = PlanOptions(tokens=1e9, global_batch_size=8, n_trials=12, results_dir=tmp_path / "r", memory_headroom_gib=0.0)
    first = plan(MODEL, [parse_candidate(f"{big}:8:2.0")], opts)
    again = plan(MODEL, [parse_candidate(f"{big}:8:3.0")], opts)  # was refused: "changed: gpu_hour_cost"
    assert again.rows[0]["step_time_s"] == first.rows[0]["step_time_s"]
    assert again.rows[0]["cost"] == pytest.approx(1.5 * first.rows[0]["cost"])


def test_cli_json_with_explanation(tmp_path, clusters, capsys):
    big, small = clusters
    code = main(["plan", "--model", MODEL, "--tokens", "1e9", "--candidate", f"{big}:8:2", "--candidate",
                 f"{small}:4", "--global-batch-size", "8", "--n-trials", "20", "--memory-headroom-gib", "0",
                 "--currency", "EUR", "--results-dir", str(tmp_path / "r"), "--json"]
                + (["--plot", str(tmp_path / "plan.png")] if HAVE_MPL else []))
    captured = capsys.readouterr()
    assert code == 0
    data = json.loads(captured.out)
    assert data["currency"] == "EUR" and data["winner"] == data["rows"][0]["candidate"]
    assert data["global_batch_size"] == 8 and isinstance(data["notes"], list)
    assert data["rows"][1]["cost"] is None and not data["rows"][1]["feasible"]
    ex = data["explanation"]
    assert ex["families"][0]["step_time_s"] == data["rows"][0]["step_time_s"]
    assert ex["why"] and ex["sensitivity"][0]["assumption"] == "as modelled"
    assert ex["sensitivity"][0]["step_time_s"][0] == pytest.approx(data["rows"][0]["step_time_s"])
    assert not HAVE_MPL or (tmp_path / "plan.png").stat().st_size > 5000
    assert "plan: searching" in captured.err and "trials, best step" in captured.err  # plain progress lines


@pytest.mark.parametrize("text", ["h100", "h100:x", "h100:0:1", "h100:8:-1", "nope:8"])
def test_bad_candidates_are_one_line_errors(text):
    with pytest.raises(ConfigError):
        parse_candidate(text)


def test_labels_write_every_differing_setting():
    a = {"tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 1, "micro_batch_size": 1,
         "sequence_parallel": True, "tp_comm_overlap": True, "use_distributed_optimizer": True}
    b = {**a, "tp_comm_overlap": False}
    labels, common = short_labels([a, b], [4, 4])
    assert labels[0] != labels[1] and "noTPoverlap" in labels[1] and "SP" in common
    assert "recompute=none" in full_label(a)


def test_a_changed_model_or_headroom_starts_a_new_study(tmp_path, clusters):
    big, _ = clusters
    cands = [parse_candidate(f"{big}:4:1")]
    first = plan(MODEL, cands, PlanOptions(tokens=1e9, global_batch_size=8, n_trials=5, results_dir=tmp_path))
    other = plan(MODEL, cands, PlanOptions(tokens=1e9, global_batch_size=8, n_trials=5, results_dir=tmp_path,
                                           memory_headroom_gib=0.5))
    assert first.rows[0]["study"] != other.rows[0]["study"]
    edited = tmp_path / "m" / "tiny-llama.yaml"  # same name, other shape
    edited.parent.mkdir()
    edited.write_text(Path(MODEL).read_text().replace("ffn_hidden_size: 512", "ffn_hidden_size: 768"))
    again = plan(str(edited), cands, PlanOptions(tokens=1e9, global_batch_size=8, n_trials=5, results_dir=tmp_path))
    assert again.rows[0]["study"] not in (first.rows[0]["study"], other.rows[0]["study"])


def test_deadline_and_budget_judge_the_expected_value_alike_and_an_unpriced_candidate_is_not_assumed_in_budget(
        tmp_path, clusters):
    # a deadline the band crossed counted as met whenever the band's low end was under it, a budget only when the
    # median was: one rule now (the expected days / cost); and with --budget an unpriced candidate was
    # recommended over a priced one known to fit it
    big, small = clusters
    first = _plan(tmp_path, clusters)
    days = first.rows[0]["days"]
    result = _plan(tmp_path, clusters, deadline_days=days * 0.999)
    assert result.rows[0]["meets_deadline"] is False  # expected days just over the deadline
    cands = [parse_candidate(f"{big}:8"), parse_candidate(f"{big}:4:3.0")]
    opts = PlanOptions(tokens=1e9, global_batch_size=8, n_trials=12, results_dir=tmp_path / "r2",
                       memory_headroom_gib=0.0, budget=1e12)
    priced = plan(MODEL, cands, opts)
    unpriced = next(r for r in priced.rows if r["gpu_hour_price"] is None)
    assert unpriced["budget_unknown"] and unpriced["within_budget"] is None
    assert priced.winner["gpu_hour_price"] == 3.0


def test_one_cluster_by_two_names_is_one_candidate(tmp_path):
    # `--candidate h100:8:2.49 --candidate h100-sxm:8:2.49` gave two identical rows and searched two studies
    opts = PlanOptions(tokens=1e9, global_batch_size=8, n_trials=12, results_dir=tmp_path / "r")
    with pytest.raises(ConfigError, match=r"same cluster \(h100-sxm\)"):
        plan(MODEL, [parse_candidate("h100:8:2.49"), parse_candidate("h100-sxm:8:2.49")], opts)


def test_a_study_of_another_echo_tune_version_is_not_reused(tmp_path, clusters, monkeypatch):
    """A study simulated by other code would mix its step times into this version's table (seen: a breakdown of
    28.438 s beside a sensitivity row of 28.370 s): the sources' digest is part of the study's name."""
    import echo_tune.plan.planner as planner_module
    from echo_tune.plan.planner import _fingerprint

    big, _ = clusters
    from echo_tune.config.load.loading import load_model

    spec = load_model(MODEL)
    now = _fingerprint(spec, str(big), 0.0)
    monkeypatch.setattr(planner_module, "code_version", lambda: {"version": "x", "sources_sha256": "0" * 64})
    assert _fingerprint(spec, str(big), 0.0) != now


def test_a_row_whose_memory_is_at_risk_says_so():
    from echo_tune.plan.report import _row_notes

    row = {"error_band": {"match": "exact", "family": "f", "note": "validated family f"}, "feasible": True, "gpu_hour_price": 1.0, "memory_band": "at risk",
           "memory_verdict": "at risk: peak 77.0 GiB on stage 0 of 78.0 GiB, 1.0 GiB spare, less than ..."}
    assert any(n.startswith("memory at risk: peak 77.0 GiB") for n in _row_notes(row))
    assert not any("memory" in n for n in _row_notes({**row, "memory_band": "fits"}))
