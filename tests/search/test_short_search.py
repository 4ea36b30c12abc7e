"""A sampling search with fewer trials than the space has structures says so before its recommendation (issue 40:
a 5-trial search once advised 512 GPUs though hundreds of layouts fit on 256)."""

from echo_tune.cli.main import main

ARGS = ["search", "--model", "llama3-8b", "--cluster", "h100", "--global-batch-size", "64", "--seed", "0"]


def test_a_short_random_search_says_it_saw_few_structures_before_its_best(tmp_path, capsys):
    assert main(ARGS + ["--num-gpus", "8", "--sampler", "random", "--n-trials", "3",
                        "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.replace("\n", " ")
    assert "short search: its trials reached" in out
    assert out.index("short search:") < out.index("best:")


def test_an_exhaustive_search_does_not(tmp_path, capsys):
    assert main(ARGS + ["--num-gpus", "8", "--sampler", "exhaustive", "--layout", "tensor_model_parallel_size=2",
                        "--layout", "pipeline_model_parallel_size=1", "--layout", "context_parallel_size=1",
                        "--results-dir", str(tmp_path)]) == 0
    assert "short search" not in capsys.readouterr().out
