"""trials.csv built a batch at a time (trials_csv.py): the bytes of building every row at once, whichever
batch brings a new column; a two-process run writes the rows it built while storing."""

from __future__ import annotations

import csv
import io

import optuna

from echo_tune.search import SearchOptions, run_search
from echo_tune.search.outputs import write as outputs
from echo_tune.search.storage.study_storage import open_storage
from echo_tune.search.outputs.trials_csv import TrialsCsv


def _trials(space, root):
    run_search(space, SearchOptions(sampler="exhaustive", results_dir=root, write_files=False))
    store = open_storage(root / space.name, None)
    study = optuna.load_study(study_name=space.name, storage=store.storage)
    return sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)


def test_batches_give_the_bytes_of_one_build(small_space, tmp_path):
    trials = _trials(small_space, tmp_path)
    whole = TrialsCsv(small_space)
    whole.add(trials)
    states = {t.state.name for t in trials}
    assert "PRUNED" in states and "COMPLETE" in states  # rows with fewer and with more columns
    for size in (1, 5, 17):
        batched = TrialsCsv(small_space)
        for k in range(0, len(trials), size):
            batched.add(trials[k:k + size], first_number=k)
        assert batched.count == len(trials)
        assert batched.text() == whole.text()
    header = whole.text().splitlines()[0].split(",")
    assert header[:2] == ["trial", "state"] and "step_time_s" in header
    assert len(whole.text().splitlines()) == len(trials) + 1


def test_a_new_column_in_a_later_batch_pads_the_rows_before_it(small_space, tmp_path):
    trials = _trials(small_space, tmp_path)
    pruned = [t for t in trials if t.state.name == "PRUNED"][:3]
    complete = [t for t in trials if t.state.name == "COMPLETE"][:2]
    built = TrialsCsv(small_space)
    built.add(pruned, first_number=0)
    built.add(complete, first_number=3)
    rows = list(csv.reader(io.StringIO(built.text())))
    assert all(len(r) == len(rows[0]) for r in rows[1:])  # the pruned rows padded empty to every column
    assert [r[0] for r in rows[1:]] == ["0", "1", "2", "3", "4"]
    assert rows[1][rows[0].index("step_time_s")] == "" != rows[4][rows[0].index("step_time_s")]


def test_a_two_process_run_writes_the_rows_built_while_storing(small_space, tmp_path, monkeypatch):
    seen = []
    original = outputs.write_trials_csv

    def spy(space, trials, path, built=None):
        seen.append(built is not None and built.count == len(trials))
        return original(space, trials, path, built)
    monkeypatch.setattr(outputs, "write_trials_csv", spy)
    run_search(small_space, SearchOptions(sampler="exhaustive", n_jobs=2, results_dir=tmp_path / "two"))
    run_search(small_space, SearchOptions(sampler="exhaustive", n_jobs=1, results_dir=tmp_path / "one"))
    assert seen == [True, False]  # one process: built once at the end (same bytes: test_exhaustive.py)
