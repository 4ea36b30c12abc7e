"""Exhaustive search: simulate every valid layout, spread over processes with joblib.

Layouts are grouped by traced shape (TP, CP, sequence parallelism, micro-batch, precision): the tracer
caches per process, so a chunk of one shape costs one trace in whichever worker runs it. Chunks come
back in order and are stored as finished trials as they arrive, so an interrupted run keeps them and
``--resume`` simulates only the layouts not stored yet.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from optuna.trial import TrialState, create_trial

from echo_tune.search.layouts import Candidate, RejectedLayout, group_by_shape
from echo_tune.search.params import full_params, search_distributions
from echo_tune.search.objective import REJECTED_CONSTRAINTS, constraints, evaluate, objective_values
from echo_tune.search.space import SearchSpace

CHUNK = 48  # layouts per task: small enough for a live progress bar, large enough to amortise dispatch


def _evaluate_chunk(space: SearchSpace, chunk: list[Candidate], profile) -> list[tuple[str, object]]:
    out = []
    for candidate in chunk:
        try:
            out.append(("ok", evaluate(space, candidate, profile=profile)[0]))
        except RejectedLayout as exc:
            out.append(("rejected", exc.rule))
    return out


def chunks_by_shape(candidates: list[Candidate], size: int = CHUNK) -> list[list[Candidate]]:
    chunks = []
    for group in group_by_shape(candidates):
        chunks += [group[i:i + size] for i in range(0, len(group), size)]
    return chunks


def _frozen(space: SearchSpace, candidate: Candidate, result: tuple[str, object]):
    """A finished trial with the same params and distributions a sampler's trial would have."""
    distributions = search_distributions(space)
    params = full_params(space, candidate)
    kind, payload = result
    if kind == "ok":
        return create_trial(state=TrialState.COMPLETE, values=objective_values(space, payload),
                            params=params, distributions=distributions,
                            user_attrs={"record": payload}, constraints=constraints(payload))
    return create_trial(state=TrialState.PRUNED, params=params, distributions=distributions,
                        user_attrs={"rejected_rule": payload, "config": candidate.config},
                        constraints=dict(REJECTED_CONSTRAINTS))


def run_exhaustive(space: SearchSpace, study, store, todo: list[Candidate], *, n_jobs: int = 1, profile=None,
                   deadline: float | None = None, on_trials: Callable[[int], None] | None = None) -> int:
    """Simulate ``todo`` and store each as a trial; returns how many were stored.

    Stops early (keeping what is stored) when ``deadline`` (time.monotonic) passes.
    """
    chunks = chunks_by_shape(todo)
    if n_jobs == 1 or len(chunks) == 1:
        return _store(space, study, store, chunks, (_evaluate_chunk(space, c, profile) for c in chunks),
                      deadline, on_trials)
    from joblib import Parallel, delayed, parallel_config

    # One thread per worker: torch's thread pools in concurrent workers otherwise fight over the cores
    # (measured: each of 2 workers ran 2x slower than a lone process).
    with parallel_config(backend="loky", inner_max_num_threads=1):
        results = Parallel(n_jobs=n_jobs, return_as="generator", batch_size=1)(
            delayed(_evaluate_chunk)(space, chunk, profile) for chunk in chunks)
        try:
            return _store(space, study, store, chunks, results, deadline, on_trials)
        finally:
            results.close()


def _store(space, study, store, chunks, results, deadline, on_trials) -> int:
    stored = 0
    for chunk, outcome in zip(chunks, results):
        trials = [_frozen(space, c, r) for c, r in zip(chunk, outcome)]
        with store.batch():
            study.add_trials(trials)
        stored += len(trials)
        if on_trials is not None:
            on_trials(len(trials))
        if deadline is not None and time.monotonic() > deadline:
            break
    return stored
