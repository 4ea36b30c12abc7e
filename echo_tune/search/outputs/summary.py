"""A finished (or interrupted) search as a SearchResult, with its output files written.

Apart from ``results`` (reading a study back) and ``outputs`` (writing files from it), which import
neither this module nor each other's callers: ``outputs`` uses ``results``, this uses both.
"""

from __future__ import annotations

import time

from optuna.trial import TrialState

from echo_tune.search.storage.accounting import account, duplicate_note, in_flight_note, missing_note
from echo_tune.search.space.dominance import DOMINATED_BY_MEMORY, OVER_MEMORY
from echo_tune.search.space.space_check import check_space
from echo_tune.search.engines.objective import OBJECTIVE_KEYS
from echo_tune.search.outputs.write import start_outputs, write_outputs
from echo_tune.search.outputs.results import (SearchResult, best_of, entry, feasible_records, pareto_of, trial_record,
                                             untimed_record)
from echo_tune.search.outputs.top_rows import top_rows
from echo_tune.search.space.search_space import SearchSpace


def summarize(space: SearchSpace, study, *, sampler: str, name: str, out_dir, where: str, started: float,
              space_size: int, notes: list[str], done_before: int, interrupted: bool, write_files: bool,
              profile=None, pool=None, built_rows=None, valid=None, expect_all: bool = False) -> SearchResult:
    """Collect the study's results, write the output files, and return the SearchResult (``pool``,
    ``built_rows``: see ``write_outputs``). The study's records are read once; the breakdown plot starts first
    (``start_outputs``: a worker draws it while this process reads the rest).

    Every layout is counted once (``accounting.py``): the coverage counts distinct layouts, a layout stored
    twice is named in a note, and a run that should have covered the space (``expect_all``: exhaustive, or
    ``--n-trials`` at least the space, no ``--timeout``) but misses layouts names them and is reported as not
    finished (``interrupted``: exit 130, "continue with --resume"). ``valid``: the space's layouts if known."""
    trials = study.get_trials(deepcopy=False)
    acc = account(trials, valid if expect_all else None, space)
    if expect_all and valid is None and acc.distinct < space_size:  # enumerated as it ran: name the missing

        acc = account(trials, check_space(space)[0], space)
    notes = notes + [n for n in (duplicate_note(acc), missing_note(acc), in_flight_note(acc)) if n]
    interrupted = interrupted or bool(acc.missing)
    feasible = feasible_records(trials)
    png = start_outputs(space, out_dir, feasible, pool) if write_files else None
    counts, records, untimed = _tally(trials)
    best_pair = best_of(space, feasible)
    best = entry(space, *best_pair, profile=profile) if best_pair else None
    pareto = []
    if len(space.objectives) > 1:
        pareto = [entry(space, n, r, profile=profile) for n, r in pareto_of(space, feasible)]
    if best is None and counts["finished"]:
        notes = notes + ["no feasible layout: every simulated layout exceeds GPU memory (see trials.csv)"]
    files: list[str] = []
    if write_files:
        files = write_outputs(space, study, out_dir, best=best, pareto=pareto, feasible=feasible, profile=profile,
                              png=png, built_rows=built_rows)
    key = OBJECTIVE_KEYS[space.objectives[0]]
    top = sorted(feasible, key=lambda nr: (nr[1][key], nr[0]))
    return SearchResult(
        study_name=name, sampler=sampler, n_trials=counts["finished"], n_feasible=len(feasible),
        n_infeasible=counts["complete"] - len(feasible) + counts["untimed"], n_rejected=counts["rejected"],
        n_untimed=counts["untimed"], untimed=untimed,
        n_dominated=counts["dominated"], n_dominated_memory=counts["dominated_memory"], n_distinct=acc.distinct,
        n_duplicates=acc.n_duplicates, missing=[acc.label(k) for k in acc.missing],
        new_trials=counts["finished"] - done_before, space_size=space_size,
        wall_time_s=time.monotonic() - started, best=best, pareto=pareto, results_dir=str(out_dir),
        storage=where, files=files, interrupted=interrupted, notes=list(notes),
        top=top_rows(top),
        records=records)


def _tally(trials) -> tuple[dict[str, int], list[dict], list[dict]]:
    """Finished, complete, rejected, dominated and untimed trials counted, the simulated records and the untimed
    layouts' memory records, in one pass."""
    counts = dict.fromkeys(("finished", "complete", "rejected", "dominated", "dominated_memory", "untimed"), 0)
    records, untimed = [], []
    for t in trials:
        if t.state == TrialState.COMPLETE:
            counts["finished"] += 1
            counts["complete"] += 1
            if (record := trial_record(t)) is not None:
                records.append(record)
        elif t.state == TrialState.PRUNED:
            counts["finished"] += 1
            dominated_by = t.user_attrs.get("dominated_by")
            if dominated_by is None:
                counts["rejected"] += 1
            elif dominated_by == OVER_MEMORY:  # over memory beyond the band, not timed: infeasible
                counts["untimed"] += 1
                if (memory := untimed_record(t)) is not None:
                    untimed.append(memory)
            else:
                counts["dominated"] += 1
                counts["dominated_memory"] += dominated_by == DOMINATED_BY_MEMORY
    return counts, records, untimed
