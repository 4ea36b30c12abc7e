"""Exhaustive search of a fresh study with several processes, the enumeration shared out with the simulation.

With the layouts enumerated here first (``check_space``: 3-4 s for the 43,194 layouts of the Qwen3-30B-A3B /
256 H100 space), the workers had nothing to do for that long, and sending them the layouts instead of
enumerating costs as much (pickling half of them 1.1 s, loading 1.3 s). So this process enumerates only the
shapes that pass the first check (``layouts.shape_prefixes``: 1,876 in 0.1 s there) and cuts them into
tasks of up to ``SHAPES_PER_TASK`` consecutive shapes; a task - in a worker or here - enumerates its shapes' layouts
(``layouts.completions``), simulates them (pieces from the trace cache, traced there on a miss) and
returns their finished trials with what the summary needs: how many layouts, and the values they take
(``Tally``). Trials come in ``batches``' order (shape by shape, costliest first), so the
study is the one ``run_exhaustive`` stores over ``check_space``'s list, whichever route ran it.

Used for a fresh study with ``n_jobs > 1``, every layout wanted (no ``--n-trials``, no ``--timeout``), a
file storage, and a space whose valid layouts cannot exceed ``MAX_VALID_LAYOUTS`` (``shapes_to_slice``);
otherwise ``check_space`` and ``run_exhaustive``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from echo_tune.limits import MAX_VALID_LAYOUTS
from echo_tune.search.space.dominance import Dominance, ordered_groups
from echo_tune.search.engines.exhaustive import (FEED_EVERY, _cost, _evaluate_batch, _interned, _store, slice_cost,
                                         structure_key)
from echo_tune.search.engines.workers import dispatch
from echo_tune.search.engines.gc_pause import gc_paused
from echo_tune.search.space.layouts import (CHECK_AFTER, SHAPE_FIELDS, RejectedLayout, _check, completions, options,
                                             shape_prefixes)
from echo_tune.search.space.space_check import unused_notes, used_values
from echo_tune.search.space.search_space import FIELD_ORDER, SearchSpace

SHAPES_PER_TASK = 16  # at most: Qwen3-30B-A3B's shapes hold 24 layouts (median), 48 at most


@dataclass
class Tally:
    """What the summary reports on a space (``check_space``), gathered task by task."""

    size: int = 0  # valid layouts
    used: dict[str, set] = field(default_factory=dict)  # searched setting -> the values valid layouts take

    def add(self, other: Tally) -> None:
        self.size += other.size
        for name, values in other.used.items():
            self.used.setdefault(name, set()).update(values)

    def notes(self, space: SearchSpace) -> list[str]:
        return unused_notes(space, {f: self.used.get(f, set()) for f in space.searched})


def shapes_to_slice(space: SearchSpace, *, n_jobs: int, every_layout: bool, shared: bool) -> list[dict] | None:
    """The space's shapes (``layouts.shape_prefixes``) where ``run_sliced`` runs a fresh study of this search,
    else None (see the module's docstring). The shapes times the combinations of the later settings bound
    the valid layouts: within ``MAX_VALID_LAYOUTS``, nothing needs counting first (DeepSeek-V3 / 1024 H100:
    5,064 shapes x 12, where the space's product is 2.9 million); past it, ``option_leaves`` counts a tighter bound
    (~1 s for 153,450) and the space goes to ``check_space`` only if that passes too. A space with no valid layout
    goes to ``check_space``, which says why."""
    if n_jobs <= 1 or not every_layout or shared:
        return None
    if math.prod(len(space.choices[f]) for f in SHAPE_FIELDS) > MAX_VALID_LAYOUTS:
        return None  # bounded work before the first check too
    shapes = list(shape_prefixes(space))
    if len(shapes) * math.prod(len(space.choices[f]) for f in FIELD_ORDER[len(SHAPE_FIELDS):]) > MAX_VALID_LAYOUTS \
            and option_leaves(space, shapes, MAX_VALID_LAYOUTS) > MAX_VALID_LAYOUTS:
        return None
    if not any(next(completions(space, p), None) is not None for p in shapes):
        return None
    return shapes


def option_leaves(space: SearchSpace, shapes: list[dict], limit: int) -> int:
    """How many ways the later settings complete ``shapes``: ``layouts.completions``' walk (the same options and
    partial checks) without the checks of each complete layout, so a bound on the valid layouts; counted until
    it passes ``limit``. Tighter than the product where settings apply only with others (recompute modules with
    selective recompute, the flex backend with the flex dispatcher) or fail the partial check (virtual stages):
    Qwen3-235B-A22B / 256 H100 with the recipe features: 106,440 valid layouts, millions by the product of the
    settings' values, 125,244 counted so, in ~1 s (see docs/search.md, "Exhaustive speed")."""
    stop, total = len(FIELD_ORDER), 0

    def count(chosen: dict, index: int) -> int:
        name = FIELD_ORDER[index]
        n = 0
        for value in options(space, name, chosen):
            if index + 1 == stop and name not in CHECK_AFTER:
                n += 1
                continue
            following = {**chosen, name: value}
            if name in CHECK_AFTER:
                try:
                    _check(space, following)
                except RejectedLayout:
                    continue
            n += 1 if index + 1 == stop else count(following, index + 1)
        return n
    for prefix in shapes:
        total += count(dict(prefix), len(SHAPE_FIELDS))
        if total > limit:
            break
    return total


def tasks(space: SearchSpace, shapes: list[dict], n_jobs: int) -> list[list[dict]]:
    """The shapes, costliest first (drawing order among equals), cut into tasks of consecutive shapes."""
    def cost(prefix: dict) -> int:
        return slice_cost(prefix["pipeline_model_parallel_size"], _check(space, prefix).num_micro_batches)
    costs = [cost(p) for p in shapes]
    order = sorted(range(len(shapes)), key=lambda i: (-costs[i], i))
    per_task = max(1, min(SHAPES_PER_TASK, -(-len(shapes) // (20 * n_jobs))))
    return [[shapes[i] for i in order[k:k + per_task]] for k in range(0, len(order), per_task)]


def _layouts(space: SearchSpace, shapes: list[dict], tally: Tally) -> list:
    """The shapes' layouts in ``batches``' order, a layout's recompute variants together."""
    out = []
    for prefix in shapes:
        members = list(completions(space, prefix))
        members.sort(key=lambda c: (-_cost(c), structure_key(c)))  # stable: drawing order among equals
        out += members
    tally.size += len(out)
    tally.used = used_values(space, out)
    return [c for group in ordered_groups(out) for c in group]


def run_task(space: SearchSpace, profile, shapes: list[dict],
             feed: Callable[[], None] | None = None) -> tuple[list, Tally]:
    """Enumerate, simulate and freeze one task's layouts (in a worker, or here with ``feed`` called every
    ``FEED_EVERY`` layouts)."""
    with gc_paused():
        space, profile = _interned(space), _interned(profile)
        tally = Tally()
        todo = _layouts(space, shapes, tally)
    dominance, done = Dominance(space, profile), []
    step = FEED_EVERY if feed is not None else max(1, len(todo))
    for k in range(0, len(todo), step):
        done += _evaluate_batch(space, todo[k:k + step], profile, {}, dominance)
        if feed is not None:
            feed()
    return done, tally


def run_sliced(space: SearchSpace, shapes: list[dict], study, store, *, n_jobs: int, profile=None,
               on_trials: Callable[[int, dict | None], None] | None = None, built=None) -> Tally:
    """Run every layout of ``shapes`` (``shapes_to_slice``) into ``study`` (fresh), enumerated by the tasks;
    returns the space's tally. An interrupted run keeps the trials stored (``KeyboardInterrupt`` passes
    through). ``built``: a ``TrialsCsv`` that gets trials.csv's rows as the trials are stored, while the
    workers simulate."""
    parts = tasks(space, shapes, n_jobs)
    tally = Tally()
    ran = dispatch(len(parts), n_jobs, lambda pool, i: pool.submit(run_task, space, profile, parts[i]),
                   lambda i, feed: run_task(space, profile, parts[i], feed))

    def results() -> Iterator[list]:
        for trials, part in ran:
            tally.add(part)
            yield trials
    try:
        _store(study, store, results(), None, on_trials, built)
    finally:
        ran.close()  # cancels the tasks not started
    return tally
