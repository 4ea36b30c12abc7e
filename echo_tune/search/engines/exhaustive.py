"""Exhaustive search: every valid layout, simulated in batches spread over processes, except those another
layout of the batch dominates (``dominance.py``: recompute variants of a layout that fits without recompute),
which are stored as dominated without being simulated.

Layouts are sorted shape by shape (``slice_of``), costliest first, within a shape by pipeline structure
(schedule, stages, chunks, micro-batches), and cut into a few batches per worker, so a worker compiles
each pipeline program once and pays one task dispatch per batch, not per layout. Here the parent traces
each shape once (torch loads only there, and only on a trace-cache miss) and sends a batch's traced
pieces with it (by reference when the trace cache holds them). Batches come back in order and are stored
as finished trials as they arrive, so an interrupted run keeps them and ``--resume`` simulates only the
layouts not stored yet. With ``n_jobs > 1`` the workers start while the layouts are enumerated
(``workers.start_workers``) and take batches in order, this process takes the next one whenever the batch to
store next is not done (feeding the workers between slices of it), and an idle worker draws the
breakdown plot (docs/search.md, "Exhaustive with several processes"). A fresh study with several processes
enumerates as it runs instead (``sliced.py``: a worker enumerates, and traces on a cache miss, the
shapes it is handed), in the same order, through the same ``workers.dispatch``.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from concurrent.futures import Future

from optuna.trial import TrialState

from echo_tune.search.space.dominance import OVER_MEMORY, Dominance, ordered_groups
from echo_tune.search.engines.freeze import Freezer
from echo_tune.search.engines.gc_pause import gc_paused
from echo_tune.identity_cache import IdentityCache
from echo_tune.search.storage.journal_trials import add_finished
from echo_tune.search.space.layouts import SHAPE_FIELDS, Candidate, RejectedLayout
from echo_tune.search.space.params import full_params, search_distributions
from echo_tune.search.engines.objective import (CONSTRAINTS_SYSTEM_ATTR, REJECTED_CONSTRAINTS, constraint_sequence, constraints,
                                       evaluate, flat_attrs, told_values)
from echo_tune.search.space.search_space import SearchSpace
from echo_tune.search.engines.workers import dispatch
from echo_tune.sim.schedule.passes import on_disk, pieces_key, seed_pieces, trace_pieces

MAX_BATCH = 128  # layouts per batch (a recompute group is not split): progress and interrupts see batches
BATCHES_PER_WORKER = 20  # enough for the processes to even out batches of unequal cost
FEED_EVERY = 8  # layouts this process simulates between handing the workers more batches


def _evaluate_batch(space: SearchSpace, batch: list[Candidate], profile, pieces: dict,
                    dominance: Dominance | None = None) -> list:
    """Simulate a batch (in a worker, or here) and return its finished trials, ready to store. ``pieces``: the
    traced pieces by key, None for those the trace cache on disk holds (``trace_pieces`` loads them once).
    A layout that another of the batch before it dominates is stored as dominated, not simulated
    (``dominance.py``; ``dominance``: carried over from the slices of the same batch before this one)."""
    with gc_paused():
        return _evaluate(space, batch, profile, pieces, dominance)


def _evaluate(space: SearchSpace, batch: list[Candidate], profile, pieces: dict, dominance: Dominance | None) -> list:
    space, profile = _interned(space), _interned(profile)
    seed_pieces({key: value for key, value in pieces.items() if value is not None})
    freeze = Freezer(search_distributions(space))
    dominance = dominance if dominance is not None else Dominance(space, profile)
    out = []
    for candidate in batch:
        rule = dominance.dominated_by(candidate)
        if rule is not None:
            result = ("dominated", rule)
        else:
            try:
                over, memory = dominance.over_memory(space, candidate, profile)  # too far over memory to time?
                result = ("over_memory", over) if over is not None else \
                    ("ok", evaluate(space, candidate, profile=profile, memory=memory)[0])
            except RejectedLayout as exc:
                result = ("rejected", exc.rule)
            dominance.simulated(candidate, None if result[0] == "rejected" else result[1])
        out.append(_frozen(space, candidate, result, freeze))
    return out


_SEEN = IdentityCache(limit=16)  # an object's pickled content -> the first object with it


def _interned(obj):
    """The object with ``obj``'s content this process already holds. A worker gets a new copy of the space
    and profile with every batch; the simulator's caches are keyed by object identity (the cluster's profile,
    the collective times, the pass costs), so with copies each batch started cold (~2x the work)."""
    if obj is None:
        return None
    return _SEEN.get((), (pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL),), lambda: obj)


def structure_key(candidate: Candidate) -> tuple:
    """What a pipeline program and a trace are shared on: layouts sorted by it batch well."""
    layout = candidate.layout
    return (layout.schedule, len(layout.stage_chunk_layers), layout.virtual_pipeline_size,
            layout.num_micro_batches, candidate.shape, candidate.num_gpus)


def _cost(candidate: Candidate) -> int:
    """Rough simulation cost: tasks of the (periodic) pipeline runs."""
    layout = candidate.layout
    p = len(layout.stage_chunk_layers)
    return layout.virtual_pipeline_size * slice_cost(p, layout.num_micro_batches)


def slice_of(candidate: Candidate) -> tuple:
    """The shape (``SHAPE_FIELDS``: ``layouts.shape_prefixes``) a layout completes."""
    return (candidate.num_gpus, *(getattr(candidate.parallel, f) for f in SHAPE_FIELDS[1:]))


def slice_cost(pipeline_model_parallel_size: int, num_micro_batches: int) -> int:
    """Rough simulation cost of a shape's layouts (``_cost`` without the interleaving)."""
    return pipeline_model_parallel_size * min(num_micro_batches, 5 * pipeline_model_parallel_size)


def batches(candidates: list[Candidate], n_jobs: int = 1) -> list[list[Candidate]]:
    """Candidates shape by shape, costliest first (the workers' last batches are short, so they finish
    together), within a shape by pipeline structure, in about ``BATCHES_PER_WORKER * n_jobs`` batches. A
    layout's recompute variants stay together in one batch, the one without recompute first
    (``dominance.ordered_groups``). The order is ``sliced.py``'s, which enumerates shape by shape."""
    first: dict[tuple, int] = {}  # shapes in drawing order
    for c in candidates:
        first.setdefault(slice_of(c), len(first))
    # stable: the enumeration order within a structure (a layout's recompute variants share its structure)
    ordered = sorted(candidates, key=lambda c: (
        -slice_cost(c.parallel.pipeline_model_parallel_size, c.layout.num_micro_batches), first[slice_of(c)],
        -_cost(c), structure_key(c)))
    size = max(1, min(MAX_BATCH, -(-len(ordered) // (BATCHES_PER_WORKER * max(1, n_jobs)))))
    return cut(ordered_groups(ordered), size)


def cut(groups: list[list[Candidate]], size: int) -> list[list[Candidate]]:
    """The groups' layouts in order, in batches of about ``size`` (over it by less than a group: a layout's
    recompute variants, a few), each group whole in one batch."""
    out: list[list[Candidate]] = []
    current: list[Candidate] = []
    for members in groups:
        current += members
        if len(current) >= size:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


def _pieces_for(space: SearchSpace, batch: list[Candidate], *, by_reference: bool = False) -> dict:
    """The traced pieces a batch needs, traced here (once per shape) if not yet known. ``by_reference``: None
    for pieces the trace cache on disk holds: a worker loads each from there once, where sending them with
    every batch pickled ~1 MB per batch (390 MB and ~9 s of this process's time over the Qwen3-30B-A3B space)."""
    first: dict[tuple, Candidate] = {}  # the pieces are keyed on the shape's settings (sim/passes._trace_kwargs)
    for c in batch:
        first.setdefault(c.shape, c)
    out = {}
    for c in first.values():
        pieces = trace_pieces(c.model, c.parallel, c.layout)
        out[pieces_key(c.model, c.parallel, c.layout)] = \
            None if by_reference and on_disk(c.model, c.parallel, c.layout) else pieces
    return out


def _frozen(space: SearchSpace, candidate: Candidate, result: tuple[str, object], freeze: Freezer):
    """A finished trial with the same params and distributions a sampler's trial would have; a dominated one
    has none (no sampler learns from it: its layout is in ``config``; storing them took ~0.9 s of a run's
    3.8 s of storing, Optuna reading each param's distribution back). ``freeze``: ``create_trial`` with the
    space's distributions (``freeze.py``)."""
    kind, payload = result
    if kind == "dominated":
        return freeze(state=TrialState.PRUNED, params={},
                      user_attrs={"dominated_by": payload, "config": candidate.config},
                      constraints=dict(REJECTED_CONSTRAINTS),
                      system_attrs={CONSTRAINTS_SYSTEM_ATTR: constraint_sequence(None)})
    if kind == "over_memory":  # its memory, no step time; like a dominated one, no params for a sampler to learn
        return freeze(state=TrialState.PRUNED, params={},
                      user_attrs={"dominated_by": OVER_MEMORY, "config": candidate.config, "memory": payload},
                      constraints=constraints(payload),
                      system_attrs={CONSTRAINTS_SYSTEM_ATTR: constraint_sequence(payload)})
    params = full_params(space, candidate)
    if kind == "ok":
        return freeze(state=TrialState.COMPLETE, values=told_values(space, payload), params=params,
                      user_attrs={"record": payload, **flat_attrs(payload)}, constraints=constraints(payload),
                      system_attrs={CONSTRAINTS_SYSTEM_ATTR: constraint_sequence(payload)})
    return freeze(state=TrialState.PRUNED, params=params,
                  user_attrs={"rejected_rule": payload, "config": candidate.config},
                  constraints=dict(REJECTED_CONSTRAINTS),
                  system_attrs={CONSTRAINTS_SYSTEM_ATTR: constraint_sequence(None)})


def run_exhaustive(space: SearchSpace, study, store, todo: list[Candidate], *, n_jobs: int = 1, profile=None,
                   deadline: float | None = None, on_trials: Callable[[int, dict | None], None] | None = None,
                   keep: Callable[[object], bool] | None = None, stored_fits: frozenset = frozenset()) -> int:
    """Simulate ``todo`` and store each as a trial; returns how many were stored.

    Stops early (keeping what is stored) when ``deadline`` (time.monotonic) passes. ``keep(trial)``: store only
    the finished trials it accepts (a re-issued claim's layouts already stored are simulated, for the dominance
    rule, but not stored twice: ``tickets.py``). ``stored_fits``: ``dominance.stored_fits`` of the layouts stored
    before, whose recompute variants are then dominated too.
    """
    with gc_paused():  # the parent holds every layout and stored trial: full collections stalled the workers
        return _run(space, study, store, todo, n_jobs, profile, deadline, on_trials, keep, stored_fits)


def _run(space, study, store, todo, n_jobs, profile, deadline, on_trials, keep=None, fits=frozenset()) -> int:
    parts = batches(todo, n_jobs)
    if n_jobs == 1 or len(parts) <= 1:
        results = (_evaluate_batch(space, b, profile, _pieces_for(space, b), Dominance(space, profile, fits))
                   for b in parts)
        return _store(study, store, results, deadline, on_trials, keep=keep)

    def submit(pool, i: int) -> Future:
        return pool.submit(_evaluate_batch, space, parts[i], profile, _pieces_for(space, parts[i], by_reference=True),
                           Dominance(space, profile, fits) if fits else None)

    def here(i: int, feed: Callable[[], None]) -> list:
        # a slice at a time, topping up the workers' queues between slices (the front batches are the
        # costliest: a worker would otherwise run dry while this process simulates one)
        b, pieces, done, dominance = parts[i], _pieces_for(space, parts[i]), [], Dominance(space, profile, fits)
        for k in range(0, len(b), FEED_EVERY):
            done += _evaluate_batch(space, b[k:k + FEED_EVERY], profile, pieces, dominance)
            feed()
        return done
    results = dispatch(len(parts), n_jobs, submit, here)
    try:
        return _store(study, store, results, deadline, on_trials, keep=keep)
    finally:
        results.close()  # cancels the batches not started


def _store(study, store, results, deadline, on_trials, built=None, keep=None) -> int:
    """Store each batch of ``results`` in turn; ``built`` (a fresh study's ``TrialsCsv``) gets each batch after it;
    ``keep``: see ``run_exhaustive``."""
    stored = 0
    for trials in results:
        if keep is not None:
            trials = [t for t in trials if keep(t)]
        add_finished(store, study, trials)
        if built is not None:
            built.add(trials, first_number=stored)
        stored += len(trials)
        if on_trials is not None:  # with the batch's fastest fitting record, for best-so-far
            fitting = [t.user_attrs["record"] for t in trials if t.user_attrs.get("record", {}).get("fits_memory")]
            on_trials(len(trials), min(fitting, key=lambda r: r["step_time_s"]) if fitting else None)
        if deadline is not None and time.monotonic() > deadline:
            break
    return stored
