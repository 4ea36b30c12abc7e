"""Out-of-memory trials as optuna-dashboard, Optuna's best_trial and trials_dataframe() see them."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import pytest

from echo_tune.search.space.auto_space import auto_space
from echo_tune.search.storage.study_storage import open_storage
from echo_tune.search.study import SearchOptions, run_search


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A search whose space holds layouts that do not fit (Llama-3.1 8B on 8 A100-40GB)."""
    out = tmp_path_factory.mktemp("dash")
    space = auto_space("llama3.1-8b", "a100-40gb", 8, 16)
    result = run_search(space, SearchOptions(sampler="random", n_trials=40, results_dir=out))
    assert result.n_infeasible > 0 and result.n_feasible > 0
    store = open_storage(Path(out) / space.name, None)
    return optuna.load_study(study_name=space.name, storage=store.storage), store


def _fits(trial) -> bool:
    return bool(trial.user_attrs.get("fits_memory"))


def test_optuna_best_and_dataframe_never_put_an_oom_trial_first(study):
    study, _ = study
    assert _fits(study.best_trial)
    df = study.trials_dataframe()
    first = df[df["state"] == "COMPLETE"].sort_values("value").iloc[0]
    assert bool(first["user_attrs_fits_memory"])
    oom = df[df["user_attrs_fits_memory"] == False]  # noqa: E712
    assert len(oom) and all(math.isinf(v) for v in oom["value"])
    assert (oom["user_attrs_memory_overshoot_gib"] > 0).all()
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        assert (max(t.constraints.values()) > 0) == (not _fits(t))


def _get(app, path: str) -> dict:
    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=path, QUERY_STRING="after=0", REQUEST_METHOD="GET", **{"wsgi.input": io.BytesIO()})
    status = []
    body = b"".join(app(environ, lambda s, h, *a: status.append(s)))
    assert status[0].startswith("200"), status
    return json.loads(body)


def test_optuna_dashboard_reads_constraints_and_best_trial(study):
    dashboard = pytest.importorskip("optuna_dashboard")
    study, store = study
    app = dashboard.wsgi(store.storage)
    detail = _get(app, f"/api/studies/{study._study_id}")
    best = detail["best_trials"][0]
    assert best["constraints"] and max(best["constraints"]) <= 0
    attrs = {a["key"]: a["value"] for a in best["user_attrs"]}
    assert attrs["fits_memory"] == "True" and float(attrs["step_time_s"]) > 0
    infeasible = [t for t in detail["trials"] if t["constraints"] and max(t["constraints"]) > 0]
    assert infeasible and all(t["number"] != best["number"] for t in infeasible)


def test_load_results_dataframe_has_feasibility_and_headroom(study):
    import echo_tune as et

    optuna_study, store = study
    folder = Path(str(store.where)).parent if str(store.where).endswith("journal.log") else Path(str(store.where))
    df = et.load_results(folder)
    finished = [t for t in optuna_study.get_trials(deepcopy=False) if t.state.is_finished()]
    assert len(df) == len(finished)
    assert {"feasible", "headroom_gib", "step_time_s", "tensor_model_parallel_size", "compute_s"} <= set(df.columns)
    assert bool(df.iloc[0]["feasible"]) and df.iloc[0]["step_time_s"] == pytest.approx(
        optuna_study.best_trial.user_attrs["step_time_s"])
    sim = df[df["fits_memory"].notna()]
    # a feasible layout has headroom; one with headroom can still be infeasible: within the memory model's
    # measured error of its limit ("at risk", SearchSpace.safe_memory), as the recompute-module variants of this
    # space now reach (0.9-1.5 GiB spare)
    assert (sim["headroom_gib"][sim["feasible"].astype(bool)] >= 0).all()
    assert not sim["feasible"][sim["headroom_gib"] < 0].astype(bool).any()
    with pytest.raises(et.ConfigError):
        et.load_results(folder.parent / "nowhere")
