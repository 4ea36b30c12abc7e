"""The default search recommends no layout that is "at risk" by the tool's own memory statistic (issue 38 item 3):
without a headroom given, fitting by less than the memory model's measured error (sim/memory/memory_band.py) counts as not
fitting; a headroom given by the user is the rule instead."""

from echo_tune.cli.main import main

ARGS = ["search", "--model", "llama3-8b", "--cluster", "h100", "--num-gpus", "8", "--global-batch-size", "64",
        "--sampler", "exhaustive", "--layout", "tensor_model_parallel_size=1,2", "--layout",
        "pipeline_model_parallel_size=1", "--layout", "micro_batch_size=1,2", "--layout", "context_parallel_size=1"]


def _best(capsys, tmp_path, *extra) -> str:
    assert main(ARGS + ["--results-dir", str(tmp_path), *extra]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("best:"))


def test_the_default_winner_is_not_at_risk_and_an_explicit_headroom_is_the_rule(tmp_path, capsys):
    # Llama-3 8B on 8 H100: TP2 MBS2 peaks at 74.8 of 77.6 GiB, 2.9 GiB spare, under the 5.4 GiB (7.3%) the memory
    # model under-predicts nine in ten measured peaks by: the default passes it over for TP2 MBS1 (22.9 GiB spare)
    safe = _best(capsys, tmp_path)
    assert "at risk" not in safe and "fits" in safe
    given = _best(capsys, tmp_path, "--memory-headroom-gib", "2", "--study-name", "given")
    assert "at risk" in given
    assert float(given.split()[1]) < float(safe.split()[1])  # the riskier layout is the faster one
