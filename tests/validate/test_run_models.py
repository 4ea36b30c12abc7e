"""Runs CSVs' `model` column and the architecture a row leaves to Megatron's defaults (validate/run_models.py)."""

from __future__ import annotations

import csv
import json

import pytest

from echo_tune.cli.main import main
from echo_tune.config.load.loading import load_model
from echo_tune.errors import ConfigError
from echo_tune.validate import read_runs
from echo_tune.validate.runs import RunCase
from echo_tune.validate.datasets import published_runs

LAYOUT = {"cluster": "h100-sxm", "num_gpus": "8", "tensor_model_parallel_size": "2", "pipeline_model_parallel_size": "1",
          "micro_batch_size": "1", "global_batch_size": "8", "precision": "bf16", "measured_step_time_s": "1.5"}
TINY = {"num_layers": "4", "hidden_size": "1024", "num_attention_heads": "16", "seq_length": "1024",
        "vocab_size": "32000"}


def write(tmp_path, rows: list[dict], name: str = "mine.csv"):
    columns = list(dict.fromkeys(k for r in rows for k in r))
    path = tmp_path / name
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def test_a_preset_gives_the_architecture_and_columns_override_it(tmp_path):
    path = write(tmp_path, [{"name": "a", "model": "llama3-8b", **LAYOUT},
                            {"name": "b", "model": "llama3-8b", "seq_length": "4096", "num_layers": "16", **LAYOUT}])
    a, b = read_runs(path)
    preset = load_model("llama3-8b")
    assert a.error is None and b.error is None
    assert (a.model.normalization, a.model.position_embedding_type, a.model.swiglu, a.model.add_bias_linear,
            a.model.untie_embeddings_and_output_weights) == ("RMSNorm", "rope", True, False, True)
    assert a.model.num_query_groups == preset.num_query_groups == 8 and a.model.seq_length == 8192
    assert (b.model.seq_length, b.model.num_layers, b.model.hidden_size) == (4096, 16, preset.hidden_size)
    assert a.defaults == () and a.model.name == "a"


def test_assumption_flags_override_the_model(tmp_path):
    (case,) = read_runs(write(tmp_path, [{"name": "a", "model": "llama3-8b", **LAYOUT,
                                          "assumptions": "flags: --hidden-dropout 0.1 --normalization LayerNorm"}]))
    assert case.error is None and case.model.hidden_dropout == 0.1 and case.model.normalization == "LayerNorm"


def test_model_yaml_and_config_json_relative_to_the_csv(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "small.yaml").write_text(
        "num_layers: 2\nhidden_size: 512\nnum_attention_heads: 8\nseq_length: 2048\nvocab_size: 32000\n"
        "normalization: RMSNorm\nswiglu: true\n")
    (tmp_path / "models" / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816,
        "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False}))
    path = write(tmp_path, [{"name": "y", "model": "models/small.yaml", **LAYOUT},
                            {"name": "j", "model": "models/config.json", "seq_length": "2048", **LAYOUT}])
    y, j = read_runs(path)
    assert y.error is None and (y.model.hidden_size, y.model.normalization, y.model.swiglu) == (512, "RMSNorm", True)
    assert j.error is None and (j.model.hidden_size, j.model.num_query_groups, j.model.seq_length) == (1024, 4, 2048)
    assert j.model.normalization == "RMSNorm" and j.model.swiglu and j.model.untie_embeddings_and_output_weights


def test_a_bad_model_is_the_row_s_one_line_error(tmp_path):
    missing, unknown = read_runs(write(tmp_path, [{"name": "m", "model": "nowhere.yaml", **LAYOUT},
                                                  {"name": "u", "model": "no-such-preset", **LAYOUT}]))
    assert "column 'model': 'nowhere.yaml' is not a file beside the CSV" in missing.error
    assert "unknown model preset 'no-such-preset'" in unknown.error
    assert "\n" not in missing.error + unknown.error


def test_a_row_of_a_model_csv_without_a_model_needs_the_architecture_columns(tmp_path):
    ok, empty = read_runs(write(tmp_path, [{"name": "ok", "model": "llama3-8b", **LAYOUT},
                                           {"name": "empty", "model": "", **LAYOUT}]))
    assert ok.error is None
    assert "names no model and leaves ['num_layers', 'hidden_size', 'num_attention_heads', 'seq_length', " \
           "'vocab_size'] empty; fill its `model` cell" in empty.error


def test_without_a_model_column_the_architecture_columns_stay_required(tmp_path):
    with pytest.raises(ConfigError, match=r"missing required column\(s\) \['num_layers', 'hidden_size'"):
        read_runs(write(tmp_path, [{"name": "a", **LAYOUT}]))


def test_a_llama_row_that_leaves_out_its_norm_and_rope_is_refused(tmp_path):
    """The old reader simulated this row with LayerNorm, learned positions, tied embeddings and biases."""
    (case,) = read_runs(write(tmp_path, [{"name": "llama", **TINY, "swiglu": "true", "num_query_groups": "4",
                                          **LAYOUT}]))
    assert case.model is None and case.error.startswith("row 'llama' states swiglu=True, num_query_groups=4 but not "
                                                        "normalization, position_embedding_type, "
                                                        "untie_embeddings_and_output_weights, add_bias_linear")
    assert "add a `model` column" in case.error and "\n" not in case.error


def test_the_assumptions_flags_or_columns_can_state_them(tmp_path):
    flags = "flags: --normalization RMSNorm --position-embedding-type rope --untie-embeddings-and-output-weights " \
            "--disable-bias-linear"
    by_flags, by_columns = read_runs(write(tmp_path, [
        {"name": "flags", **TINY, "swiglu": "true", **LAYOUT, "assumptions": flags},
        {"name": "columns", **TINY, "swiglu": "true", **LAYOUT, "normalization": "RMSNorm",
         "position_embedding_type": "rope", "untie_embeddings_and_output_weights": "true",
         "add_bias_linear": "false"}]))
    lesser = ("ffn_hidden_size 4 x hidden_size (2/3 of it with --swiglu)", "--hidden-dropout 0.1",
              "--attention-dropout 0.1")  # listed, never refused
    assert by_flags.error is None and by_flags.defaults == lesser and by_flags.model.normalization == "RMSNorm"
    assert by_columns.error is None and by_columns.defaults == lesser and not by_columns.model.add_bias_linear


def test_a_gpt3_like_row_lists_the_defaults_it_takes(tmp_path):
    (case,) = read_runs(write(tmp_path, [{"name": "gpt", **TINY, **LAYOUT}]))
    assert case.error is None and case.model.normalization == "LayerNorm"
    assert case.defaults == ("--normalization LayerNorm", "--position-embedding-type learned_absolute",
                             "tied embeddings (no --untie-embeddings-and-output-weights)",
                             "biases (no --disable-bias-linear)", "GeLU MLP (no --swiglu)",
                             "ffn_hidden_size 4 x hidden_size (2/3 of it with --swiglu)", "--hidden-dropout 0.1",
                             "--attention-dropout 0.1")
    assert case.assumed_flags == ()  # what the row's assumptions column applied: nothing


def test_the_shipped_sets_are_listed_not_refused():
    """runs_modern's Nemotron-4 rows state GQA and no biases but neither norm nor position embedding: a copy is
    refused, the shipped file keeps validating as it did and lists the defaults."""
    cases = {c.name: c for c in read_runs(published_runs("runs_modern.csv"))}
    nemotron = cases["dgxc2411-nemotron4-15b-bf16-16gpu"]
    assert nemotron.error is None
    assert nemotron.defaults == ("--normalization LayerNorm", "--position-embedding-type learned_absolute")
    assert cases["dgxc2411-llama31-8b-bf16-8gpu"].defaults == ()


def test_a_copy_of_a_shipped_row_is_held_to_the_rule(tmp_path):
    source = published_runs("runs_modern.csv")
    with open(source, newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["name"] == "dgxc2411-nemotron4-15b-bf16-16gpu"]
    (case,) = read_runs(write(tmp_path, rows), errata=False)
    assert case.error is not None and "but not normalization, position_embedding_type" in case.error


def test_the_model_column_simulates_as_the_full_columns():
    """The example CSV's rows (model column) are runs_bridge_2025's H100 Llama rows (architecture columns)."""
    from echo_tune.sim.simulate import simulate

    example = {c.name: c for c in read_runs(published_runs("runs_bridge_2025.csv").parent.parent
                                            / "example-runs" / "h100-llama-runs.csv")}
    full = {c.name: c for c in read_runs(published_runs("runs_bridge_2025.csv")) if c.name in example}
    assert len(example) == len(full) == 5
    for name in ("mb2509-llama3-8b-fp8-8xh100", "mb2511-llama3-70b-fp8cs-64xh100"):
        a, b = example[name], full[name]
        assert a.error is None and a.defaults == ()
        step = [simulate(c.model, c.cluster, c.num_gpus, c.parallel).step_time_s for c in (a, b)]
        assert step[0] == pytest.approx(step[1], rel=1e-9)


def test_validate_cli_reads_a_model_csv(tmp_path, capsys):
    assert main(["validate", str(write(tmp_path, [{"name": "a", "model": "llama3-8b", **LAYOUT}])), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["rows"]
    assert row["error"] is None and row["predicted_step_time_s"] > 0


def test_runcase_default_is_no_defaults():
    assert RunCase(name="x", source="s", measured_step_time_s=1.0).defaults == ()
