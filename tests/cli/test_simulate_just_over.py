"""simulate: a layout predicted over its memory limit by less than the memory model's measured over-prediction
(1.9% of its allocator bytes, plan/safety.py) is "at risk" with its throughput, not "does not fit" (issue 40)."""

import json

from echo_tune.cli.main import main

LINE = ["simulate", "--model", "llama3-8b", "--cluster", "h100", "--num-gpus", "8", "--tensor-model-parallel-size",
        "2", "--sequence-parallel", "--micro-batch-size", "2", "--global-batch-size", "64",
        "--use-distributed-optimizer"]


def test_just_over_the_limit_is_at_risk_with_its_throughput(capsys):
    # peak 74.78 GiB of 79.65 GiB HBM: a 4.97 GiB headroom leaves it 0.1 GiB over, 3 GiB more is far over
    assert main(LINE + ["--memory-headroom-gib", "4.97"]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "at risk: peak 74.8 GiB, 0.10 GiB over" in out and "throughput" in out and "no throughput" not in out
    assert main(LINE + ["--memory-headroom-gib", "4.97", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tokens_per_s"] > 0 and data["memory_verdict"].startswith("at risk")
    assert main(LINE + ["--memory-headroom-gib", "8"]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "does not fit" in out and "no throughput" in out
