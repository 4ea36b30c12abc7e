"""`echo-tune presets` and `--version`."""

import json


from echo_tune.cli.main import main
from echo_tune.config.load.loading import preset_names


def test_presets_json_lists_every_model_gpu_and_cluster(capsys):
    assert main(["presets", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for kind in ("models", "gpus", "clusters"):
        assert [r["name"] for r in data[kind]] == preset_names(kind)
    llama = next(r for r in data["models"] if r["name"] == "llama3.1-70b")
    assert 70 < llama["params_billion"] < 71 and llama["num_query_groups"] == 8
    assert any(r["alias"] == "h100" for r in data["clusters"])


def test_presets_one_kind_table(capsys):
    assert main(["presets", "clusters"]) == 0
    out = capsys.readouterr().out
    assert "h100-sxm" in out and "gb200-nvl72" in out and "gb300-nvl72" in out and "llama" not in out


def test_version(capsys):
    assert main(["--version"]) == 0  # main returns argparse's exit code (no SystemExit)
    assert "echo-tune 0.1.0" in capsys.readouterr().out
