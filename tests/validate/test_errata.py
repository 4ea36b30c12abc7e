"""Errata of the published-runs datasets (validate/errata.py): source-stated settings the CSVs have no
column for, each with its source file, commit and quoted key; applied by default, listed, switchable off."""

import csv
import json
import re
from pathlib import Path

import pytest

from echo_tune.cli.main import main
from echo_tune.errors import ConfigError
from echo_tune.validate import read_runs
from echo_tune.validate.errata import ERRATA_DIR, errata_path_for, load_errata
from echo_tune.validate.datasets import published_runs

MODERN = published_runs("runs_modern.csv")
HEADER = ["name", "source", "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size", "cluster",
          "num_gpus", "tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
          "global_batch_size", "precision", "measured_step_time_s", "assumptions"]
ROW = ["tiny", "test", "4", "1024", "16", "1024", "32000", "a100-80gb", "8", "2", "2", "1", "16", "bf16", "0.5", ""]
ERRATA = """
dataset: runs.csv
sources:
  recipe:
    source: "example/repo@0123456789ab conf/tiny.yaml"
    settings:
      - flags: "--hidden-dropout 0.0 --attention-dropout 0.0"
        quote: "hidden_dropout: 0.0; attention_dropout: 0.0"
      - flags: "--grad-reduce-in-bf16"
        quote: "optim.grad_sync_dtype: bf16"
      - flags: "--micro-batch-size 4"
        quote: "micro_batch_size: 4"
rows:
  tiny: [recipe]
"""


def write(tmp_path, rows, header=HEADER):
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    errata = tmp_path / "errata.yaml"
    errata.write_text(ERRATA)
    return path, errata


def test_errata_apply_where_no_column_sets_the_field_and_are_listed(tmp_path):
    path, errata = write(tmp_path, [ROW])
    (case,) = read_runs(path, errata)
    assert case.error is None
    assert case.model.hidden_dropout == case.model.attention_dropout == 0.0 and case.parallel.grad_reduce_in_bf16
    assert case.parallel.micro_batch_size == 1  # the CSV's column wins over the erratum
    assert len(case.errata) == 2 and all("example/repo@0123456789ab conf/tiny.yaml" in e for e in case.errata)
    (plain,) = read_runs(path, errata=False)
    assert plain.errata == () and plain.model.hidden_dropout == 0.1 and not plain.parallel.grad_reduce_in_bf16


def test_the_rows_assumptions_win_over_the_errata(tmp_path):
    row = ROW[:-1] + ["flags: --hidden-dropout 0.2"]
    path, errata = write(tmp_path, [row])
    (case,) = read_runs(path, errata)
    assert case.model.hidden_dropout == 0.2 and case.model.attention_dropout == 0.0


@pytest.mark.parametrize("text, named", [
    ("sources: {}\n", "`sources` and `rows`"),
    ("sources: {a: {source: x@1 f, settings: [{flags: --no-such-flag, quote: q}]}}\nrows: {}\n", "--no-such-flag"),
    ("sources: {a: {source: x@1 f, settings: [{flags: --log-interval 1, quote: q}]}}\nrows: {}\n", "set nothing"),
    ("sources: {a: {source: x@1 f, settings: [{flags: --hidden-dropout 0.0, quote: q}]}}\nrows: {r: [b]}\n", "'r'"),
    ("sources: {a: {source: x@1 f, settings: [{flags: --micro-batch-size 1, quote: q, corrects: micro_batch_size}]}}"
     "\nrows: {}\n", "needs a `reason`"),
    ("sources: {a: {source: x@1 f, settings: [{flags: --micro-batch-size 1, quote: q, corrects: num_layers, "
     "reason: r}]}}\nrows: {}\n", "must name fields its flags set"),
])
def test_a_broken_errata_file_is_one_line_naming_the_problem(tmp_path, text, named):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_errata(path)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_config_states_model_fields_no_flag_can(tmp_path):
    # TransformerConfig fields Megatron-LM has no flag for (activation_func_clamp_value: providers set it), or a
    # flag's absence; validated like any model field and listed with the erratum
    path, errata = write(tmp_path, [ROW])
    errata.write_text(ERRATA.replace('      - flags: "--grad-reduce-in-bf16"',
                                     '      - flags: "--quick-geglu --no-bias-gelu-fusion"\n        config: {activation_func_clamp_value: 7.0, '
                                     'glu_linear_offset: 1.0}\n        quote: "provider"\n'
                                     '      - flags: "--grad-reduce-in-bf16"'))
    (case,) = read_runs(path, errata)
    assert case.error is None and case.model.activation_func_clamp_value == 7.0 and case.model.quick_geglu
    assert any("--quick-geglu --no-bias-gelu-fusion activation_func_clamp_value=7.0 glu_linear_offset=1.0" in e
               for e in case.errata)
    errata.write_text(ERRATA.replace('      - flags: "--grad-reduce-in-bf16"',
                                     '      - flags: ""\n        config: {no_such_field: 1}\n        quote: "q"\n'
                                     '      - flags: "--grad-reduce-in-bf16"'))
    with pytest.raises(ConfigError, match="`config` of 'recipe' must map model fields"):
        read_runs(path, errata)


def test_a_correction_overrides_its_column_and_says_why(tmp_path):
    path, errata = write(tmp_path, [ROW])
    errata.write_text(ERRATA.replace('quote: "micro_batch_size: 4"', 'quote: "micro_batch_size: 4"\n'
                                     '        corrects: micro_batch_size\n        reason: "GBS / DP / GA disagree"'))
    (case,) = read_runs(path, errata)
    assert case.parallel.micro_batch_size == 4  # the correction wins over the CSV's 1
    assert any("corrects micro_batch_size" in e and "GBS / DP / GA disagree" in e for e in case.errata)


def test_shipped_errata_cite_a_commit_and_parse():
    files = sorted(ERRATA_DIR.glob("*.yaml"))
    assert files
    for path in files:
        for row, errata in load_errata(path).items():
            assert errata
            for e in errata:
                assert re.search(r"^[\w.-]+/[\w.-]+@[0-9a-f]{12,40} \S", e.source), e.source
                assert e.quote and e.flags.startswith("--")


def test_runs_modern_errata_name_existing_rows_and_are_listed_by_the_cli(capsys):
    assert errata_path_for(MODERN) == ERRATA_DIR / "runs_modern.yaml"
    with MODERN.open(newline="") as handle:
        names = {row["name"] for row in csv.DictReader(handle)}
    table = load_errata(errata_path_for(MODERN))
    assert set(table) <= names
    # the Grok-1 rows' dispatcher as their source file states it, and the CSV's default without errata
    cases = {c.name: c for c in read_runs(MODERN)}
    plain = {c.name: c for c in read_runs(MODERN, errata=False)}
    grok = "dgxc2411-grok1-314b-bf16-512gpu"
    assert cases[grok].model.moe_token_dispatcher_type == "alltoall"
    assert plain[grok].model.moe_token_dispatcher_type == "allgather" and not plain[grok].errata
    assert cases["dgxc2411-nemotron4-340b-bf16-128gpu"].parallel.exp_avg_dtype == "bf16"
    assert main(["validate", str(MODERN), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert any("grok1/grok1_314b.yaml" in e and "alltoall" in e for e in rows[grok]["errata"])
    assert main(["validate", str(MODERN), "--json", "--no-errata"]) == 0
    assert all(not r["errata"] for r in json.loads(capsys.readouterr().out)["rows"])


def test_runs_megatron_table1_rows_run_interleaved_as_the_papers_script_states():
    """Narayanan et al. 2021 ran Table 1 with the interleaved schedule; its launch script
    (Megatron-LM examples/academic_paper_scripts/sc21/run_table_1.sh) gives the layers per virtual stage:
    76B 60/4/5 = 3 chunks, 145B 80/8/5 = 2, 310B 96/16/3 = 2, 530B 105/35/1 = 3; the rest none."""
    path = published_runs("runs_megatron.csv")
    cases = {c.name: c for c in read_runs(path)}
    plain = {c.name: c for c in read_runs(path, errata=False)}
    chunks = {"row6-GPT-76.1B": 3, "row7-GPT-145.6B": 2, "row8-GPT-310.1B": 2, "row9-GPT-529.6B": 3}
    for name, case in cases.items():
        assert plain[name].parallel.virtual_pipeline_model_parallel_size in (None, 1)
        assert (case.parallel.virtual_pipeline_model_parallel_size or 1) == chunks.get(name, 1), name
        if name in chunks:  # a whole number of layers per chunk, as the script's flag gives it
            layers_per_chunk = case.model.num_layers / case.parallel.pipeline_model_parallel_size / chunks[name]
            assert layers_per_chunk == {"row6-GPT-76.1B": 5, "row7-GPT-145.6B": 5, "row8-GPT-310.1B": 3,
                                        "row9-GPT-529.6B": 1}[name]
            assert any("corrects virtual_pipeline_model_parallel_size" in e for e in case.errata)
