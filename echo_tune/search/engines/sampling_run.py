"""A search that samples: each trial asked of the sampler, simulated and told, in this process and (``n_jobs > 1``)
in extra processes sharing the study through its storage (``study.py`` runs the study; this is its sampling
phase, ``run_sampling``, and the one-trial step the dashboard's tests drive, ``run_one_trial``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import optuna
from optuna.trial import TrialState

from echo_tune.search.outputs import results as res
from echo_tune.search.storage.claim import WORKER_ATTR, claim, die_with_parent, started_count, stop_requested, worker_id
from echo_tune.search.space.layouts import RejectedLayout
from echo_tune.search.space.baselines import baselines
from echo_tune.search.space.space_check import check_space
from echo_tune.search.storage.liveness import Reaper, heartbeat
from echo_tune.search.engines.objective import (CONSTRAINTS_SYSTEM_ATTR, REJECTED_CONSTRAINTS, Evaluator, constraint_sequence,
                                       constraints, flat_attrs, told_values)
from echo_tune.search.options import SearchOptions
from echo_tune.search.space.params import full_params, suggest_layout
from echo_tune.search.storage.accounting import account, fail_dead_running
from echo_tune.search.engines.sampler import DEFAULT_N_TRIALS, make_sampler
from echo_tune.search.space.search_space import SearchSpace
from echo_tune.search.storage.study_storage import StudyStorage, open_storage


def _tell_rejected(study, trial, exc: RejectedLayout) -> None:
    trial.set_user_attr("rejected_rule", exc.rule)
    trial.set_user_attr("config", {k: v for k, v in exc.config.items()})
    for key, value in REJECTED_CONSTRAINTS.items():
        trial.set_constraint(key, value)
    study._storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_SYSTEM_ATTR, constraint_sequence(None))
    study.tell(trial, state=TrialState.PRUNED)


STOP = object()
"""``run_one_trial``'s answer when ``admit`` said the study holds its target already."""


def run_one_trial(space: SearchSpace, study, store: StudyStorage, evaluator: Evaluator, admit=None):
    """Ask the sampler for a layout, simulate it, tell the result. Returns the record (None if rejected).

    The ask and the tell are each written as one batch; the simulation runs outside the lock. The ask
    happens under the storage's cross-process claim, after ``admit()`` (if given) agreed, so workers
    sharing the study never overshoot its target (returns ``STOP`` when not admitted). A trial cut short
    (Ctrl-C) is told FAIL, as Optuna's own loop does; when the storage itself fails (a full disk), its
    error is the one raised, not Optuna's "Cannot tell a COMPLETE trial".
    """
    trial, told = None, False
    try:
        with claim(store):
            if admit is not None and not admit():
                return STOP
            trial = study.ask()
            trial.set_user_attr(WORKER_ATTR, worker_id())
            try:
                candidate = suggest_layout(trial, space)
            except RejectedLayout as exc:
                _tell_rejected(study, trial, exc)
                told = True
                return None
        try:
            record = evaluator(candidate)
        except RejectedLayout as exc:
            with store.batch():
                _tell_rejected(study, trial, exc)
            told = True
            return None
        with store.batch():
            trial.set_user_attr("record", record)
            for key, value in flat_attrs(record).items():
                trial.set_user_attr(key, value)
            for key, value in constraints(record).items():
                trial.set_constraint(key, value)
            study._storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_SYSTEM_ATTR, constraint_sequence(record))
            study.tell(trial, told_values(space, record))
        told = True
        return record
    except BaseException:
        if trial is not None and not told:
            try:
                with store.batch():
                    study.tell(trial, state=TrialState.FAIL)
            except Exception:  # noqa: BLE001 - the storage itself failed (a full disk): the error in flight says why
                pass
        raise


def _sampling_loop(space, study, store, evaluator, target: int, deadline: float | None,
                   progress: Callable[[dict | None], None] | None) -> None:
    # finished trials plus those running in live workers (a killed run's leftovers do not count)
    def admit() -> bool:
        return started_count(study, res.FINISHED) < target
    reaper = Reaper()
    with heartbeat(study, store):  # other hosts' workers see this one alive (liveness.py)
        while (deadline is None or time.monotonic() < deadline) and not stop_requested():
            record = run_one_trial(space, study, store, evaluator, admit)
            if record is STOP:  # the target counts other workers' trials in flight: wait for them to end
                if reaper.reap(study, store):  # or take a gone worker's over
                    continue
                if not any(t.user_attrs.get(WORKER_ATTR) for t in reaper.others_running(study)):
                    return
                time.sleep(IN_FLIGHT_POLL_S)
                continue
            if progress is not None:
                progress(record)


IN_FLIGHT_POLL_S = 0.05


def _one_torch_thread(threads: int | None = 1) -> int | None:
    """Set torch's intra-op threads and return the previous count, if torch is loaded (tracing is its only
    user: a search whose shapes are in the trace cache never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None or threads is None:
        return None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    return before


def _worker(space: SearchSpace, opts: SearchOptions, name: str, out_dir: Path, sampler_seed, target: int,
            seconds_left: float | None, profile, parent: int | None = None) -> None:
    """One extra process of a parallel sampling run (n_jobs > 1): same study, its own sampler seed."""
    die_with_parent(parent, signals="stop")  # a SIGKILLed parent must not leave this process searching on alone
    _one_torch_thread()  # concurrent processes' thread pools otherwise fight over the cores
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = open_storage(out_dir, opts.storage)
    valid, _ = check_space(space)
    sampler = make_sampler(opts.sampler, space, valid, sampler_seed, opts.n_trials, opts.n_jobs)
    study = optuna.load_study(study_name=name, storage=store.storage, sampler=sampler)
    deadline = None if seconds_left is None else time.monotonic() + seconds_left
    _sampling_loop(space, study, store, Evaluator(space, profile), target, deadline, None)


def run_sampling(space, study, store, opts, name, out_dir, valid, seed, existed, done_before, deadline,
                    profile, progress) -> None:
    # the wrapped samplers propose unseen valid layouts only: once every one is simulated, stop. The target
    # counts layouts: a layout a killed run of an older version stored twice counts once (accounting.py)
    extra = account(study.get_trials(deepcopy=False)).n_duplicates if existed and done_before else 0
    target = min(opts.n_trials or DEFAULT_N_TRIALS, len(valid)) + extra
    if existed:  # a killed run's trials in flight: FAIL, so their layouts are asked again (accounting.py)
        fail_dead_running(study, store)
    total = max(0, target - done_before)
    if not existed and opts.baselines:
        with claim(store):  # workers started together on a fresh study: one of them enqueues them
            if not study.user_attrs.get("baselines_enqueued"):
                for c in baselines(space, valid)[:total]:
                    study.enqueue_trial(full_params(space, c), user_attrs={"baseline": True})
                study.set_user_attr("baselines_enqueued", True)
    evaluator = Evaluator(space, profile)

    def on_trial(record: dict | None) -> None:
        if progress is not None:
            progress(res.finished_count(study) - done_before, total, record)
    if opts.n_jobs == 1:
        _sampling_loop(space, study, store, evaluator, target, deadline, on_trial)
        return
    threads = _one_torch_thread()
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        with ProcessPoolExecutor(opts.n_jobs - 1, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(_worker, space, opts, name, out_dir, None if seed is None else seed + 1000 * (i + 1),
                                   target, left, profile, os.getpid()) for i in range(opts.n_jobs - 1)]
            _sampling_loop(space, study, store, evaluator, target, deadline, on_trial)
            for f in futures:
                f.result()
    finally:
        _one_torch_thread(threads)
