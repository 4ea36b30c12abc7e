"""Parsers with hard limits (issue 41 items 3 and 4): a pipeline layout is sized before it is unrolled, repeat
counts and nesting have limits, launch lines skip a launcher's own flags, and blank or empty values are one-line
errors. Each case runs the CLI as a user would (exit 2, one line, no traceback) or the parser itself."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.config.launch.launch_tokens import split_line
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.specs.pipeline_layout import parse_layout
from echo_tune.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SIM = ["simulate", "--model", "gpt-1.7b", "--num-gpus", "8", "--global-batch-size", "64"]
LINE = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 --max-position-embeddings 128 "
        "--vocab-size 1000 --micro-batch-size 1 --global-batch-size 8 --bf16")


def _one_line_error(argv: list[str], capsys, *words: str) -> str:
    start = time.monotonic()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert time.monotonic() - start < 30, "refused in bounded time"
    return err


# --- --pipeline-model-parallel-layout ------------------------------------------------------------------------

@pytest.mark.parametrize("layout,words", [
    ("E(t*999999)*100000|L", ("unrolled layers <= 1,000,000", "99,999,900,003 layers")),  # 20 characters
    ("E|(t*999999|)*999999|L", ("unrolled layers <= 1,000,000",)),
    ("E(t*" + "9" * 5000 + ")|L", ("repeat count digits <= 7", "5,000 digits")),
    ("E|t*" + "1" * 40 + "|L", ("repeat count digits <= 7", "40 digits")),
    ("E((t)*2)*3|L", ("parenthesis depth <= 1",)),
    ("E" + "(" * 10_000 + "t" + ")" * 10_000 + "|L", ("parenthesis depth <= 1",)),
], ids=["20-chars", "nested-unroll", "5000-digits", "40-digits", "nested", "10000-deep"])
def test_layout_limits_are_checked_before_unrolling(layout, words, capsys):
    err = _one_line_error(SIM + ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", layout],
                          capsys, "pipeline_model_parallel_layout", *words)
    assert len(err) < 600, "the error quotes a long layout cut short"


def test_layout_parser_never_builds_the_unrolled_string():
    start = time.monotonic()
    with pytest.raises(ConfigError, match="unrolled layers"):
        parse_layout("E(t*999999)*100000|L")
    assert time.monotonic() - start < 1


def test_layouts_within_the_limits_still_unroll():
    assert len(parse_layout("E|(t*9|)*1000L")) == 1002
    assert sum(len(s) for s in parse_layout("E(t*9999)*99L")) == 9999 * 99 + 2


def test_rank_refuses_a_layout_bomb(tmp_path, capsys):
    candidate = {"name": "c", "model": "gpt-1.7b", "cluster": "a100-80gb", "num_gpus": 8,
                 "layout": {"pipeline_model_parallel_size": 2, "global_batch_size": 64, "micro_batch_size": 1,
                            "pipeline_model_parallel_layout": "E(t*999999)*100000|L"}}
    path = tmp_path / "rank.yaml"
    path.write_text(yaml.safe_dump({"candidates": [candidate]}))
    _one_line_error(["rank", str(path), "--tokens", "1e9"], capsys, "unrolled layers <= 1,000,000")


def test_an_empty_quoted_layout_in_a_launch_line_is_one_line(capsys):
    _one_line_error(["simulate", "--num-gpus", "8", "--megatron-args",
                     f"{LINE} --pipeline-model-parallel-size 2 --pipeline-model-parallel-layout ''"], capsys,
                    "pipeline_model_parallel_layout")


@pytest.mark.parametrize("flag", ["--tensor-model-parallel-size", "--seq-length", "--lr"])
def test_an_empty_quoted_value_is_the_flags_value(flag):
    problems: list = []
    assert split_line(f"{flag} '' --bf16", {}, problems) == [(flag, ("",)), ("--bf16", ())] and problems == []


# --- launch lines: a launcher's own flags, blank lines -------------------------------------------------------

TORCHRUN = ("CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node 8 --nnodes 2 --node_rank 0 "
            "--master_addr 10.0.0.1 --master_port 6000 pretrain_gpt.py --tensor-model-parallel-size 2 " + LINE)


@pytest.mark.parametrize("line", [
    TORCHRUN,
    "torchrun --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=h:29500 /opt/Megatron-LM/pretrain_gpt.py "
    "--tensor-model-parallel-size 2 " + LINE,
    "python -u -m torch.distributed.run --nproc_per_node 8 pretrain_gpt.py --tensor-model-parallel-size 2 " + LINE,
    "/usr/bin/python3.12 -u pretrain_gpt.py --tensor-model-parallel-size 2 " + LINE,
    "deepspeed --num_gpus 8 pretrain_gpt.py --tensor-model-parallel-size 2 " + LINE,
    "torchrun --nproc_per_node 8 --nnodes 2 -m megatron.training.pretrain_gpt --tensor-model-parallel-size 2 " + LINE,
], ids=["torchrun-env", "torchrun-equals", "python-m-run", "python-u", "deepspeed", "torchrun-module"])
def test_a_full_launch_line_skips_the_launchers_flags(line):
    model, parallel, precision, _ = parse_megatron_line(line)
    assert parallel["tensor_model_parallel_size"] == 2 and model["num_layers"] == 2 and precision == "bf16"


def test_a_torchrun_line_simulates(capsys):
    assert main(["simulate", "--num-gpus", "16", "--megatron-args", TORCHRUN]) == 0
    assert "TP2" in capsys.readouterr().out


def test_a_launchers_flags_after_the_script_are_still_checked():
    with pytest.raises(ConfigError, match="--nnodes"):
        parse_megatron_line("torchrun pretrain_gpt.py --nnodes 2 " + LINE)


@pytest.mark.parametrize("line,got", [("  ", "a blank line"), ("\t\n", "a blank line"), ("''", "only the program"),
                                      ("torchrun --nnodes 2 pretrain_gpt.py", "only the program")])
def test_a_blank_launch_line_is_refused_not_read_as_fp32(line, got, capsys):
    err = _one_line_error(SIM + ["--megatron-args", line], capsys, "`the Megatron launch line holds a flag`", got)
    assert "fp32" not in err
    with pytest.raises(ConfigError, match="holds a flag"):
        parse_megatron_line(line)


def test_an_empty_launch_line_is_refused_by_the_parser():
    with pytest.raises(ConfigError, match="a blank line"):
        parse_megatron_line("")


# --- YAML / JSON: numbers of any length ----------------------------------------------------------------------

MODEL = {"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "seq_length": 256,
         "vocab_size": 1000}


@pytest.mark.parametrize("key", ["num_layers", "ffn_hidden_size", "seq_length"])
@pytest.mark.parametrize("digits", [5001, 101])
def test_a_number_of_thousands_of_digits_in_a_model_yaml_is_one_line(key, digits, tmp_path, capsys):
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump({k: v for k, v in MODEL.items() if k != key}) + f"{key}: {'9' * digits}\n")
    _one_line_error(SIM + ["--model", str(path)], capsys, str(path), f"a number of {digits:,} characters",
                    "`characters of a number <= 100`")


def test_a_number_of_thousands_of_digits_in_a_config_json_is_one_line(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": ' + "9" * 5001 + ', "num_hidden_layers": 2}')
    _one_line_error(SIM + ["--model", str(path), "--seq-length", "1024"], capsys, "a number of 5,001 characters")


def test_long_text_and_ordinary_numbers_still_read(tmp_path):
    from echo_tune.safe_yaml import load_json, load_yaml

    assert load_yaml("a: '" + "9" * 5001 + "'\nb: " + "x" * 5001 + "\nc: 68719476736\n", "f")["c"] == 68719476736
    assert load_json('{"a": "' + "9" * 5001 + '", "b": [1.5e10, -3, 12345678901234567890]}', "f")["b"][2] == \
        12345678901234567890


@pytest.mark.parametrize("extra", ["--lr {n}", "--moe-layer-freq {n}", "--num-layers={n}", "--tensor-model-parallel-size {n}",
                                   "--recompute-modules {n} core_attn"])
def test_a_number_of_thousands_of_digits_on_a_launch_line_is_one_line(extra, capsys):
    line = LINE.replace("--num-layers 2 ", "--num-layers 2 " if "num-layers" not in extra else "")
    err = _one_line_error(["simulate", "--num-gpus", "8", "--megatron-args", f"{line} {extra.format(n='9' * 5000)}"],
                          capsys, "`characters of a number <= 100`", "5,000 characters")
    assert len(err) < 400


def test_a_rank_files_blank_megatron_args_is_refused(tmp_path, capsys):
    candidate = {"name": "c", "model": "gpt-1.7b", "cluster": "a100-80gb", "num_gpus": 8, "megatron_args": "  "}
    path = tmp_path / "rank.yaml"
    path.write_text(yaml.safe_dump({"candidates": [candidate]}))
    _one_line_error(["rank", str(path), "--tokens", "1e9"], capsys, "`the Megatron launch line holds a flag`")
