"""EP and ETP as search dimensions: the example MoE spaces load, expand `auto`, and search."""

from __future__ import annotations

import json
from pathlib import Path

from echo_tune.cli.main import main
from echo_tune.search import load_space
from echo_tune.search.space.layouts import enumerate_layouts

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"


def test_mixtral_space_expands_ep_and_keeps_megatron_rules():
    space = load_space(SPACES / "mixtral-8x7b-64xh100.yaml")
    assert space.choices["expert_model_parallel_size"] == (1, 2, 4, 8)
    assert space.choices["expert_tensor_parallel_size"] == (None, 1)
    layouts = list(enumerate_layouts(space))
    eps = {c.parallel.expert_model_parallel_size for c in layouts}
    assert eps == {1, 2, 4, 8}
    for c in layouts:
        p = c.parallel
        assert p.tensor_model_parallel_size == 1 or c.layout.sequence_parallel
        assert c.layout.expert_data_parallel_size * p.expert_tensor_size * p.expert_model_parallel_size == \
            p.tensor_model_parallel_size * c.layout.data_parallel_size


def test_no_layout_is_enumerated_twice_under_another_etp_spelling():
    """Unset ETP is Megatron's default, ETP = TP: at TP 1, `ETP 1` and unset are the same layout, at TP 2 they
    are not (search/space/layouts.py keeps the first listed spelling of each)."""
    space = load_space(SPACES / "mixtral-8x7b-64xh100.yaml")
    layouts = list(enumerate_layouts(space))

    def canonical(c):
        config = dict(c.config)
        config["expert_tensor_parallel_size"] = c.parallel.expert_tensor_size
        return tuple(sorted(config.items()))

    keys = [canonical(c) for c in layouts]
    assert len(keys) == len(set(keys))
    etp_at = {(c.parallel.tensor_model_parallel_size, c.parallel.expert_tensor_parallel_size) for c in layouts}
    assert (1, None) in etp_at and (1, 1) not in etp_at  # TP 1: one spelling
    assert {(2, None), (2, 1)} <= etp_at  # TP 2: ETP 2 (unset) and ETP 1 are different layouts


def test_mixtral_search_runs_with_ep(tmp_path, capsys):
    assert main(["search", str(SPACES / "mixtral-8x7b-64xh100.yaml"), "--n-trials", "12", "--seed", "0",
                 "--results-dir", str(tmp_path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    best = json.loads((Path(out["results_dir"]) / "best.json").read_text())
    assert best["fits_memory"] and "expert_model_parallel_size" in best["config"]
    lines = (Path(out["results_dir"]) / "megatron_args.txt").read_text()
    assert "--num-experts 8" in lines


def test_deepseek_space_loads_with_uneven_stages():
    space = load_space(SPACES / "deepseek-v3-1024xh100.yaml")
    assert space.model.multi_latent_attention and space.model.num_experts == 256
    first = next(enumerate_layouts(space))
    assert sum(first.layout.stage_layers) == 61


def test_search_refuses_a_space_with_an_unmodelled_setting(tmp_path, capsys):
    space = (SPACES / "mixtral-8x7b-64xh100.yaml").read_text().replace(
        "  micro_batch_size: [1, 2]", "  micro_batch_size: [1, 2]\n  cpu_offloading: true")
    path = tmp_path / "space.yaml"
    path.write_text(space)
    assert main(["search", str(path), "--n-trials", "2", "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cpu_offloading" in err and "not modelled" in err
