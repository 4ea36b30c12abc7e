"""An empty --megatron-args (issue 40) is refused in one line, like a blank line, not silently ignored."""

from __future__ import annotations

import pytest

from echo_tune.cli.main import main

SIM = ["simulate", "--model", "gpt-1.7b", "--num-gpus", "8", "--global-batch-size", "64"]


@pytest.mark.parametrize("argv", [
    ["simulate", "--megatron-args", ""],                      # the default run plus an empty line
    ["simulate", "--megatron-args="],                         # the joined spelling
    [*SIM, "--megatron-args", ""],                            # laid over a preset
    ["emulate", "--cluster", "h100", *SIM[1:], "--megatron-args", ""],
    ["profile", "--cluster", "h100", *SIM[3:], "--model", "gpt-1.7b", "--megatron-args", ""],
])
def test_an_empty_line_is_refused_in_one_line(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "the Megatron launch line holds a flag" in lines[0] and "a blank line ('')" in lines[0]
    assert "leave --megatron-args out" in lines[0]
    assert "Traceback" not in err and out == ""


def test_a_blank_line_is_refused_the_same_way(capsys):
    assert main([*SIM, "--megatron-args", "   "]) == 2
    assert "a blank line ('   ')" in capsys.readouterr().err
