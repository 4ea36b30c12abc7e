"""Studies on the small example: exhaustive vs TPE, outputs, infeasible layouts, resume, Pareto fronts."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import optuna
import pandas as pd
import pytest

from echo_tune.config.launch.megatron_args import MEGATRON_FLAGS
from echo_tune.config.flags.unmodelled import LEGACY
from echo_tune.errors import ConfigError
from echo_tune.config.flags.flag_catalog import megatron_flags
from echo_tune.search import SearchOptions, check_space, load_space, run_search, space_from_dict
from echo_tune.search.space.params import full_params
from echo_tune.search.engines.objective import Evaluator
from echo_tune.search.space.dominance import OVER_MEMORY
from echo_tune.sim.memory.memory_band import PEAK_OVER_PREDICTION
from echo_tune.search.storage.study_storage import open_storage
from echo_tune.search.engines.sampling_run import run_one_trial

SPACES = Path(__file__).resolve().parents[2] / "search_spaces"


def megatron_flag_list() -> set[str]:
    """Every flag Megatron-LM defines at the reference commit (config/data/megatron_flags.json, generated from
    its arguments.py by config/flags/flag_catalog_build.py)."""
    return set(megatron_flags())


def test_tpe_and_exhaustive(small_exhaustive, small_tpe):
    """The 200-trial "within 1%" check runs through the CLI in tests/cli/test_search_cli.py."""
    assert small_exhaustive.n_trials == small_exhaustive.space_size > 500
    assert small_tpe.n_trials == 60 and small_tpe.n_rejected == 0  # the sampler proposes valid layouts only
    optimum = small_exhaustive.best["step_time_s"]
    assert optimum <= small_tpe.best["step_time_s"] <= 1.10 * optimum


def test_exhaustive_covers_every_valid_layout_once(small_exhaustive, small_space):
    """Each layout once: simulated, or stored as dominated (search/space/dominance.py, tests/search/test_dominance.py)."""
    rows = pd.read_csv(Path(small_exhaustive.results_dir) / "trials.csv", keep_default_na=False)
    assert len(rows) == small_exhaustive.space_size
    assert set(rows[rows.dominated_by == ""].state) == {"COMPLETE"}
    assert (rows.dominated_by != "").sum() == small_exhaustive.n_dominated + small_exhaustive.n_untimed
    assert small_exhaustive.n_dominated > 0 and small_exhaustive.n_untimed > 0
    settings = [c for c in rows.columns if c.endswith("_size") or c in ("sequence_parallel", "recompute_granularity",
                                                                          "use_distributed_optimizer")]
    assert not rows.duplicated(subset=settings).any()
    valid, _ = check_space(small_space)
    assert len(valid) == len(rows)


def test_infeasible_layouts_are_recorded_and_never_best(small_exhaustive):
    rows = pd.read_csv(Path(small_exhaustive.results_dir) / "trials.csv")
    # over memory: simulated, or (by more than the memory model's error) its memory alone, its step not simulated
    untimed = rows[rows.dominated_by == OVER_MEMORY]
    assert len(untimed) == small_exhaustive.n_untimed > 0 and (untimed.state == "PRUNED").all()
    assert (untimed.memory_overshoot_bytes > PEAK_OVER_PREDICTION * untimed.peak_memory_bytes).all()
    assert untimed.step_time_s.isna().all() and not untimed.feasible.any() and untimed.worst_stage.notna().all()
    rows = rows[rows.state == "COMPLETE"]  # simulated (a dominated layout is not)
    over = rows[~rows.feasible]
    assert len(over) + len(untimed) == small_exhaustive.n_infeasible and len(over) > 0
    assert (over.memory_overshoot_bytes > 0).all() and over.worst_stage.notna().all()
    best = small_exhaustive.best
    assert best["fits_memory"] and best["step_time_s"] == pytest.approx(rows[rows.feasible].step_time_s.min())
    assert best["step_time_s"] > rows.step_time_s.min()  # a faster layout exists, but does not fit


def test_output_files(small_tpe):
    out = Path(small_tpe.results_dir)
    for name in ("trials.csv", "best.json", "megatron_args.txt", "best_trace.json", "journal.log"):
        assert (out / name).is_file(), name
    best = json.loads((out / "best.json").read_text())
    assert {"step_time_s", "config", "tokens_per_s", "mfu", "peak_memory_bytes", "fits_memory", "breakdown_s",
            "memory_verdict", "stage_memory_bytes", "megatron_args", "specs"} <= set(best)
    assert best["config"]["tensor_model_parallel_size"] >= 1 and "num_gpus" in best["config"]
    trace = json.loads((out / "best_trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    rows = pd.read_csv(out / "trials.csv")
    for column in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
                   "recompute_granularity", "step_time_s", "compute_s", "pp_bubble_s", "feasible", "rejected_rule"):
        assert column in rows.columns


def test_megatron_args_txt_uses_real_flags_only(small_tpe):
    known = megatron_flag_list()
    lines = (Path(small_tpe.results_dir) / "megatron_args.txt").read_text().splitlines()
    flags = [line.split()[0] for line in lines if line and not line.startswith("#")]
    assert "--tensor-model-parallel-size" in flags and "--global-batch-size" in flags
    assert set(flags) <= known, set(flags) - known
    # legacy spellings (an older Megatron-LM's, e.g. --virtual-pipeline-model-parallel-size, never written, or
    # --no-async-tensor-model-parallel-allreduce, written only for a layout that sets it) are accepted too
    assert MEGATRON_FLAGS <= known | set(LEGACY)


def test_same_seed_same_study(small_space, tmp_path):
    runs = []
    for i in range(2):
        result = run_search(small_space, SearchOptions(n_trials=30, seed=7, results_dir=tmp_path / str(i),
                                                       write_files=False))
        study = optuna.load_study(study_name=result.study_name, storage=open_storage(
            Path(result.results_dir)).storage)
        runs.append([(t.params, t.values) for t in study.get_trials()])
    assert runs[0] == runs[1]


def test_resume_keeps_trials_and_adds_the_missing_ones(small_space, tmp_path):
    first = run_search(small_space, SearchOptions(n_trials=25, results_dir=tmp_path, write_files=False))
    with pytest.raises(ConfigError, match="--resume"):
        run_search(small_space, SearchOptions(n_trials=40, results_dir=tmp_path))
    store = open_storage(Path(first.results_dir))
    before = [(t.number, t.params, t.values) for t in optuna.load_study(study_name=first.study_name,
                                                                        storage=store.storage).get_trials()]
    again = run_search(small_space, SearchOptions(n_trials=40, results_dir=tmp_path, resume=True))
    assert again.n_trials == 40 and again.new_trials == 15
    after = optuna.load_study(study_name=first.study_name, storage=open_storage(Path(first.results_dir)).storage)
    assert [(t.number, t.params, t.values) for t in after.get_trials()][:25] == before
    other = load_space(SPACES / "small-gpt7b-cost.yaml")
    with pytest.raises(ConfigError, match="different search space"):
        run_search(other, SearchOptions(study_name=first.study_name, results_dir=tmp_path, resume=True))


def test_rejected_trial_records_the_rule(small_space, tmp_path):
    store = open_storage(tmp_path)
    study = optuna.create_study(study_name="r", storage=store.storage)
    valid, _ = check_space(small_space)
    params = full_params(small_space, valid[0])
    params.update(tensor_model_parallel_size=8, pipeline_model_parallel_size=4)  # 32 GPUs on 16
    study.enqueue_trial(params)
    assert run_one_trial(small_space, study, store, Evaluator(small_space)) is None
    trial = study.get_trials()[0]
    assert trial.state.name == "PRUNED" and "must hold" in trial.user_attrs["rejected_rule"]
    assert trial.constraints and max(trial.constraints.values()) > 0


def test_multi_objective_pareto_front(tmp_path):
    space = load_space(SPACES / "small-gpt7b-cost.yaml")
    result = run_search(space, SearchOptions(sampler="nsga2", n_trials=60, results_dir=tmp_path))
    front = [(e["objectives"]["step_time"], e["objectives"]["cost"]) for e in result.pareto]
    assert front and all(e["fits_memory"] for e in result.pareto)
    for a in front:  # nobody on the front dominates anybody else on it
        assert not any(b != a and b[0] <= a[0] and b[1] <= a[1] for b in front)
    assert len(pd.read_csv(Path(result.results_dir) / "pareto.csv")) == len(front)
    ET.parse(Path(result.results_dir) / "pareto.svg")
    assert "pareto" in result.to_dict() and result.to_dict()["pareto"][0]["config"]["num_gpus"] in (8, 16, 32)


def test_no_feasible_layout_is_reported(tmp_path):
    space = space_from_dict({"model": "gpt3-175b", "cluster": "a100-40gb", "num_gpus": 8, "global_batch_size": 8,
                             "layout": {"tensor_model_parallel_size": [8]}}, name="too-big")
    result = run_search(space, SearchOptions(sampler="exhaustive", results_dir=tmp_path))
    assert result.best is None and result.n_infeasible == result.n_trials == 1
    assert not (Path(result.results_dir) / "best.json").exists()


def test_parallel_sampling_processes_share_the_study(small_space, tmp_path):
    result = run_search(small_space, SearchOptions(n_trials=30, n_jobs=2, results_dir=tmp_path, write_files=False))
    study = optuna.load_study(study_name=result.study_name, storage=open_storage(Path(result.results_dir)).storage)
    trials = study.get_trials()
    assert 30 <= result.n_trials <= 31
    # simulated, or stored over memory with its memory alone (search/space/dominance.py OVER_MEMORY)
    assert all(t.state.name == "COMPLETE" or t.user_attrs.get("dominated_by") == OVER_MEMORY for t in trials)
    assert len({t.number for t in trials}) == len(trials)


def test_trials_csv_writes_integers_as_integers(small_exhaustive):
    # a column of integers with gaps (VPP unset on some rows) was written 2.0, which --num-virtual-stages... refuses
    text = (Path(small_exhaustive.results_dir) / "trials.csv").read_text().splitlines()
    header = text[0].split(",")
    for name in ("virtual_pipeline_model_parallel_size", "tensor_model_parallel_size", "micro_batch_size"):
        if name in header:
            i = header.index(name)
            assert not any(line.split(",")[i].endswith(".0") for line in text[1:]), name


def test_best_states_no_price_per_step_without_a_price(small_tpe):
    # cost_per_step printed 1.085 with no price given (GPU-hours at 1 per GPU-hour): GPU-hours are named so
    best = small_tpe.best
    assert best["cost_per_step"] is None
    assert best["gpu_hours_per_step"] == pytest.approx(best["step_time_s"] * best["config"]["num_gpus"] / 3600)
