"""A finished (or interrupted) search as a SearchResult, with its output files written.

Apart from ``results`` (reading a study back) and ``outputs`` (writing files from it), which import
neither this module nor each other's callers: ``outputs`` uses ``results``, this uses both.
"""

from __future__ import annotations

import time

from optuna.trial import TrialState

from echo_tune.search.dominance import DOMINATED_BY_MEMORY
from echo_tune.search.objective import OBJECTIVE_KEYS
from echo_tune.search.outputs import write_outputs
from echo_tune.search.results import (FINISHED, SearchResult, best_feasible, entry, feasible_records,
                                      pareto_front, trial_record)
from echo_tune.search.space import SearchSpace


def summarize(space: SearchSpace, study, *, sampler: str, name: str, out_dir, where: str, started: float,
              space_size: int, notes: list[str], done_before: int, interrupted: bool, write_files: bool,
              profile=None, pool=None, built_rows=None) -> SearchResult:
    """Collect the study's results, write the output files, and return the SearchResult (``pool``,
    ``built_rows``: see ``write_outputs``)."""
    trials = study.get_trials(deepcopy=False)
    finished = [t for t in trials if t.state in FINISHED]
    feasible = feasible_records(trials)
    best_pair = best_feasible(space, trials)
    best = entry(space, *best_pair, profile=profile) if best_pair else None
    pareto = []
    if len(space.objectives) > 1:
        pareto = [entry(space, n, r, profile=profile) for n, r in pareto_front(space, trials)]
    if best is None and finished:
        notes = notes + ["no feasible layout: every simulated layout exceeds GPU memory (see trials.csv)"]
    files: list[str] = []
    if write_files:
        files = write_outputs(space, study, out_dir, best=best, pareto=pareto, profile=profile, pool=pool,
                              built_rows=built_rows)
    key = OBJECTIVE_KEYS[space.objectives[0]]
    top = sorted(feasible, key=lambda nr: (nr[1][key], nr[0]))
    return SearchResult(
        study_name=name, sampler=sampler, n_trials=len(finished), n_feasible=len(feasible),
        n_infeasible=sum(1 for t in finished if t.state == TrialState.COMPLETE) - len(feasible),
        n_rejected=sum(1 for t in finished if t.state == TrialState.PRUNED and "dominated_by" not in t.user_attrs),
        n_dominated=sum(1 for t in finished if t.state == TrialState.PRUNED and "dominated_by" in t.user_attrs),
        n_dominated_memory=sum(1 for t in finished if t.user_attrs.get("dominated_by") == DOMINATED_BY_MEMORY),
        new_trials=len(finished) - done_before, space_size=space_size,
        wall_time_s=time.monotonic() - started, best=best, pareto=pareto, results_dir=str(out_dir),
        storage=where, files=files, interrupted=interrupted, notes=list(notes),
        top=[{"trial": n, **r} for n, r in top[:20]],
        records=[r for t in trials if (r := trial_record(t)) is not None])
