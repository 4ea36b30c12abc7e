"""load_results keeps word-valued settings as written: recompute 'none' is the word, not NaN."""

import pandas as pd

from echo_tune.results_api import load_results
from echo_tune.search import SearchOptions, run_search
from echo_tune.search.space.search_space import space_from_dict


def test_recompute_none_stays_a_word(tmp_path):
    space = space_from_dict({"name": "words", "model": "gpt-7.5b", "cluster": "a100-80gb", "num_gpus": 8,
                             "global_batch_size": 8, "layout": {
                                 "tensor_model_parallel_size": [8], "pipeline_model_parallel_size": [1],
                                 "recompute_granularity": ["none", "selective"]}})
    result = run_search(space, SearchOptions(sampler="exhaustive", results_dir=tmp_path, study_name="words"))
    df = load_results(tmp_path / "words")
    assert sorted(df["recompute_granularity"]) == ["none", "selective"]
    assert df["recompute_granularity"].notna().all() and df["fp8_format"].eq("none").all()
    rows = pd.read_csv(tmp_path / "words" / "trials.csv")  # the CSV reads back the same words
    assert sorted(rows["recompute_granularity"]) == ["none", "selective"]
    assert result.n_trials == 2
