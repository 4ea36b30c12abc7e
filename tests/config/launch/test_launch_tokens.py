"""Launch lines read as Megatron-LM's argparse reads them (config/launch/launch_tokens.py; Megatron-LM d98e8a64ddf3
megatron/training/arguments.py: ArgumentParser(allow_abbrev=False), store_true flags, validate_args asserts)."""

from __future__ import annotations

import pytest

from echo_tune.config.launch.launch_tokens import split_line
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.errors import ConfigError

LINE = ("python pretrain_gpt.py --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
        "--max-position-embeddings 128 --vocab-size 1000 --micro-batch-size 1 --global-batch-size 8")


def test_flag_equals_value_is_the_same_as_flag_value():
    a = parse_megatron_line(LINE + " --tensor-model-parallel-size=2 --recompute-modules=core_attn")
    b = parse_megatron_line(LINE + " --tensor-model-parallel-size 2 --recompute-modules core_attn")
    assert a[:3] == b[:3] and a[1]["tensor_model_parallel_size"] == 2


def test_values_are_taken_by_the_flags_arity():
    problems: list = []
    items = split_line("prog --lr -0.5 --data-path a b c --recompute-modules core_attn mlp --swiglu",
                       {"--recompute-modules": "+", "--swiglu": 0}, problems)
    assert problems == []
    assert items == [("--lr", ("-0.5",)), ("--data-path", ("a", "b", "c")),
                     ("--recompute-modules", ("core_attn", "mlp")), ("--swiglu", ())]


@pytest.mark.parametrize("extra,words", [
    ("--sequence-parallel=false", "takes no value"), ("--sequence-parallel=true", "takes no value"),
    ("--swiglu false", "`false` is not a flag"), ("--swiglu 1", "`1` is not a flag"),
    ("--bf16 --fp16", "--bf16 and --fp16"), ("\u2014tensor-model-parallel-size 2", "U+2014"),
    ("-tp 2", "write `--tensor-model-parallel-size`"), ("-pp=2", "`-pp`"),
    ("--seq-length 256", "max_position_embeddings >= seq_length"), ("--micro-batch-size", "needs a value"),
])
def test_lines_megatron_refuses_are_refused(extra, words):
    with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace("+", r"\+")) as err:
        parse_megatron_line(f"{LINE} {extra}")
    assert "\n" not in str(err.value)


def test_the_same_line_without_the_fault_reads():
    model, parallel, precision, _ = parse_megatron_line(LINE + " --swiglu --sequence-parallel --bf16")
    assert model["swiglu"] and parallel["sequence_parallel"] and precision == "bf16"
    assert "max_position_embeddings" not in model  # equal to the sequence: the default


def test_every_problem_of_a_line_is_reported_at_once():
    with pytest.raises(UnmodelledError) as err:
        parse_megatron_line(LINE + " --no-such-a 1 --no-such-b --no-such-c x")
    lines = str(err.value).splitlines()
    assert lines[0] == "3 problems in the Megatron launch line:" and len(lines) == 4
    assert all(f"--no-such-{c}" in line for c, line in zip("abc", lines[1:]))
    with pytest.raises(ConfigError) as err:  # mixed kinds: a ConfigError listing each
        parse_megatron_line(LINE + " --swiglu=1 -tp 2 --hidden-size x")
    assert len(str(err.value).splitlines()) == 4
