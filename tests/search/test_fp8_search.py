"""FP8 as a search dimension: the search chooses between bf16 and FP8 GEMMs and writes the FP8 flags."""

from pathlib import Path

import pandas as pd

from echo_tune.search import SearchOptions, load_space, run_search

SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "gpt3-175b-128xb200-fp8.yaml"


def test_search_chooses_between_bf16_and_fp8(tmp_path):
    space = load_space(SPACE)
    assert space.choices["fp8_format"] == (None, "hybrid")
    result = run_search(space, SearchOptions(sampler="exhaustive", results_dir=tmp_path, study_name="fp8"))
    rows = pd.read_csv(Path(result.results_dir) / "trials.csv")
    assert set(rows.fp8_format.fillna("none")) == {"none", "hybrid"}
    assert result.best["config"]["fp8_format"] == "hybrid"  # FP8 GEMMs: the faster layouts on B200
    flags = (Path(result.results_dir) / "megatron_args.txt").read_text()
    assert "--fp8-format hybrid" in flags and "--attention-backend unfused" in flags


def test_no_fp8_choice_on_a100():
    from echo_tune.search.space.search_space import space_from_dict

    space = space_from_dict({"model": "gpt-7.5b", "cluster": "a100-80gb", "num_gpus": 8, "global_batch_size": 8,
                             "layout": {"fp8_format": "auto"}})
    assert space.choices["fp8_format"] == (None,)
