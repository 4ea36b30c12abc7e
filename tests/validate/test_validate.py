"""The runs-CSV contract of `echo-tune validate`, and a regression guard on published runs."""

import csv
import json
from pathlib import Path

import pytest

from echo_tune.cli.main import main
from echo_tune.errors import ConfigError
from echo_tune.validate import read_runs, spearman, validate
from echo_tune.validate.datasets import published_runs

SHARED_RUNS = published_runs("runs_megatron.csv")
HEADER = ["name", "source", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size", "cluster",
          "num_gpus", "tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
          "global_batch_size", "recompute_granularity", "precision", "measured_step_time_s", "assumptions", "extra"]
ROW = ["tiny", "test", "4", "1024", "16", "1024", "32000", "a100-80gb", "8", "2", "2", "1", "16", "full", "bf16",
       "0.5", "--overlap-grad-reduce assumed;", "ignored"]


def write(tmp_path, header=HEADER, rows=(ROW,)):
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def test_reads_megatron_columns_and_assumed_flags(tmp_path):
    (case,) = read_runs(write(tmp_path))
    assert case.error is None and case.num_gpus == 8
    assert case.parallel.tensor_model_parallel_size == 2 and case.parallel.recompute_granularity == "full"
    assert case.parallel.overlap_grad_reduce and case.assumed_flags == ("--overlap-grad-reduce",)
    assert case.model.hidden_size == 1024


def test_missing_column_is_named(tmp_path):
    header = [c for c in HEADER if c != "measured_step_time_s"]
    row = [v for c, v in zip(HEADER, ROW) if c != "measured_step_time_s"]
    with pytest.raises(ConfigError, match=r"missing required column\(s\) \['measured_step_time_s'\]"):
        read_runs(write(tmp_path, header, [row]))


def test_bad_value_and_broken_rule_are_reported_not_skipped(tmp_path):
    bad_value = list(ROW)
    bad_value[0], bad_value[HEADER.index("num_layers")] = "bad-value", "four"
    bad_rule = list(ROW)
    bad_rule[0], bad_rule[HEADER.index("tensor_model_parallel_size")] = "bad-rule", "3"
    rows, summary, _ = validate(write(tmp_path, rows=[ROW, bad_value, bad_rule]))
    assert [r.name for r in rows] == ["tiny", "bad-value", "bad-rule"]
    assert "column 'num_layers' must hold an integer, but got 'four'" in rows[1].error
    assert "must hold" in rows[2].error and "tensor_model_parallel_size=3" in rows[2].error
    assert summary["n_rows"] == 3 and summary["n_scored"] == 1


def test_relative_cluster_path(tmp_path):
    (tmp_path / "clusters").mkdir()
    (tmp_path / "clusters" / "mine.yaml").write_text(
        "gpu: h100-sxm\ngpus_per_node: 8\nintra_node_bandwidth_gbyte_s: 450\nnics_per_node: 8\nnic_bandwidth_gbit_s: 400\n")
    row = list(ROW)
    row[HEADER.index("cluster")] = "clusters/mine.yaml"
    (case,) = read_runs(write(tmp_path, rows=[row]))
    assert case.error is None and case.cluster.name == "mine" and case.cluster.gpu.name == "h100-sxm"


def test_cli_json(tmp_path, capsys):
    assert main(["validate", str(write(tmp_path)), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"rows", "mape_pct", "max_abs_error_pct", "spearman"} <= set(data)
    assert {"name", "predicted_step_time_s", "measured_step_time_s", "error_pct", "fits_memory"} <= set(data["rows"][0])


def test_missing_file_one_line(capsys):
    assert main(["validate", "nowhere.csv"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)


# Regression guard: rows of the published runs whose error must stay under the bound (datasheet
# profiles, no per-row factors). Bounds: the 25% per row, and 10% on average.
GUARDED = ["row1-GPT-1.7B", "row5-GPT-39.1B", "row7-GPT-145.6B", "row20-GPT-174.6B", "row23-GPT-529.6B",
           "row43-GPT-16B", "row45-GPT-70B", "row48-GPT-314B"]


def test_published_runs_regression_guard():
    rows, summary, _ = validate(SHARED_RUNS)
    by_name = {r.name: r for r in rows}
    for name in GUARDED:
        assert abs(by_name[name].error_pct) < 25.0, (name, by_name[name].error_pct)
    assert all(r.error is None for r in rows)
    assert summary["mape_pct"] <= 10.0


@pytest.mark.xfail(strict=True, reason="row44-GPT-32B (Megatron-LM README H100 table) +32.6% with the H100 preset's "
                                       "sustained clock (1,575 MHz under the 700 W limit; +23.4% at the 1,830 MHz "
                                       "peak clock): the README's H100 rows run 5-15% faster than that clock allows, "
                                       "the dgxc/NeMo H100 rows do not (calibration/published-runs-fit/README.md)")
def test_published_runs_no_row_over_25_percent():
    _, summary, _ = validate(SHARED_RUNS)
    assert summary["max_abs_error_pct"] <= 25.0


def test_assumed_flags_with_values_and_fp8_columns(tmp_path):
    header = HEADER + ["fp8_format", "fp8_param_gather"]
    row = ROW[:16] + ["flags: --grad-reduce-in-bf16 --use-distributed-optimizer --use-precision-aware-optimizer "
                      "--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16; NeMo dtype: bf16", "x", "", "false"]
    (case,) = read_runs(write(tmp_path, header, (row,)))
    assert case.error is None and case.parallel.exp_avg_dtype == case.parallel.exp_avg_sq_dtype == "bf16"
    assert case.parallel.grad_reduce_in_bf16 and case.parallel.fp8_format is None
    fp8_row = ROW[:16] + ["", "x", "hybrid", "false"]
    fp8_row[7] = "h100-sxm"
    (fp8,) = read_runs(write(tmp_path, header, (fp8_row,)))
    assert fp8.parallel.fp8_format == "hybrid" and fp8.parallel.precision == "bf16"


def test_every_row_refused_says_so_instead_of_an_empty_mape(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    bad = list(ROW)
    bad[HEADER.index("tensor_model_parallel_size")] = "3"
    main(["validate", str(write(tmp_path, rows=[bad]))])
    out = capsys.readouterr().out
    assert "no row simulated (1 rows, each refused above)" in out and "MAPE -%" not in out
