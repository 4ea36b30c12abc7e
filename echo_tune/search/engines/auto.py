"""The default search ("auto"): structure first, then every layout of the best structures.

Why: a layout space is a few hundred *structures* (GPU count, TP, PP, CP, EP, ETP, uneven pipeline split,
FP8 or not), each holding tens to a couple of hundred layouts that differ in the remaining settings
(micro-batch, interleaving, recompute, communication overlaps). The structure decides most of the step time and
the remaining settings are few, so:

1. **representatives** - every structure is simulated at a few of its layouts (``REPRESENTATIVES``:
   the fastest if it fits, the lightest on memory, the typical one, and the typical one at the structure's middle
   number of virtual stages where it has them), so a structure whose layouts
   mostly exceed memory still shows whether it can fit, and one that is best at a large micro-batch
   without recompute shows that. Every structure's first representative comes before any second one,
   the structures in a spread order, so a budget too small for the round still samples them all over.
   Where the structures are too many for every representative within the budget (DeepSeek-V3 / 1024 H100),
   they are ranked on their typical layout (and their fastest where that fits, their lightest where it does
   not) first and only the best get the other representatives (``_halving``);
2. **survivors** - structures in the order of their best representative, each simulated completely
   (every layout of it), while the budget (``--n-trials``, default ``AUTO_BUDGET``) allows; then the next
   structure's fastest layouts fill the budget;
3. a space no larger than the budget is simulated completely (the exhaustive search).

A space with recipe features runs these rounds on the features' lead values with 3/4 of the budget, then the
feature level (feature_level.py) with the rest (``search_rounds``).

Each round is stored as finished trials (``exhaustive.run_exhaustive``: batched, spread over ``--n-jobs``
processes), and the next round is computed from the stored trials only, with no random draw: the same
space gives the same layouts for every seed, and an interrupted search resumed continues with the layouts
it had not simulated yet. The order of the survivors depends on the representatives only, so a resumed
search ends with the same set of layouts as an uninterrupted one.

Measured with benchmarks/search_quality.py (table in docs/search.md).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable

from optuna.trial import TrialState

from echo_tune.search.space.dominance import stored_fits
from echo_tune.search.engines.exhaustive import run_exhaustive
from echo_tune.search.engines.feature_level import feature_level
from echo_tune.search.engines.feature_variants import has_features
from echo_tune.search.space.layouts import Candidate, config_key
from echo_tune.search.space.search_space import SearchSpace

AUTO_BUDGET = 3000
"""Layouts the default search simulates at most (about 2 ms each in the simulator): in a space with recipe features,
2,250 for the structure-first level and 750 for their combinations (FEATURE_SHARE). 4,000 (3,000 + 1,000) made
``plan`` of three candidates take 17.4 s instead of 9.2 s on the 2-core machine (docs/usage.md's command)."""

STRUCTURE_FIELDS = ("num_gpus", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                    "context_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size",
                    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                    "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split", "fp8_format",
                    "pipeline_model_parallel_layout")

FEATURE_SHARE = 4
"""Of the budget, a space with recipe features keeps budget / FEATURE_SHARE for its feature level
(feature_variants.py); the first level takes the rest."""

REPRESENTATIVES = 4
"""Layouts simulated per structure in round 1."""

_GOLDEN = 0.6180339887498949


_STRUCTURE_SETTINGS = operator.attrgetter(*STRUCTURE_FIELDS[1:])  # every field but num_gpus: ParallelConfig's


def structure(c: Candidate) -> tuple:
    """The layout's STRUCTURE_FIELDS values (read off the settings: a config dict per call cost the default
    search more than its simulations, ~2 s of a 7 s search on Qwen3-30B-A3B / 256 H100)."""
    return (c.num_gpus, *_STRUCTURE_SETTINGS(c.parallel))


_RECOMPUTE = {"full": 2, "selective": 1, None: 0}


def _light(c: Candidate) -> tuple:
    """Lightest on memory first: full recompute, smallest micro-batch, no interleaving."""
    p = c.parallel
    return (-_RECOMPUTE.get(p.recompute_granularity, 0), p.micro_batch_size,
            p.virtual_pipeline_model_parallel_size or 1, not p.tp_comm_overlap)


def _fast(c: Candidate) -> tuple:
    """Fastest if it fits: no recompute, largest micro-batch, TP-comm overlap, no interleaving."""
    p = c.parallel
    return (_RECOMPUTE.get(p.recompute_granularity, 0), -p.micro_batch_size, not p.tp_comm_overlap,
            p.virtual_pipeline_model_parallel_size or 1)


def _typical(c: Candidate) -> tuple:
    """What a practitioner tries first: selective recompute, overlaps on, small micro-batch, no interleaving."""
    p = c.parallel
    recompute = {"selective": 0, None: 1, "full": 2}.get(p.recompute_granularity, 3)
    return (recompute, not p.tp_comm_overlap, p.micro_batch_size, p.virtual_pipeline_model_parallel_size or 1)


def _interleaved(members: list[Candidate]) -> list[Candidate]:
    """The typical layout at the structure's middle number of virtual stages ([] without interleaving): a pipeline
    structure's step time can hinge on interleaving, beyond its bubble (Megatron overlaps the EP all-to-all only
    with virtual stages: Qwen3-235B-A22B / 256 H100 TP2 PP4 EP32, 15.2 s without, 11.0 s at 4-24 virtual stages),
    and the fewest virtual stages is the heaviest (78.6 GiB there at 2, 68.6 GiB at 8)."""
    stages = sorted({c.parallel.virtual_pipeline_model_parallel_size for c in members} - {None})
    if not stages:
        return []
    middle = stages[len(stages) // 2]

    def light_typical(c: Candidate) -> tuple:  # the memory-saving defaults on where listed (not part of _typical:
        # a small GPT space's interleaved pick without the distributed optimizer did not fit, and its structure, the
        # optimum's, ranked on full recompute)
        return (*_typical(c)[:1], not c.parallel.use_distributed_optimizer, not c.parallel.sequence_parallel,
                *_typical(c)[1:])
    return [min((c for c in members if c.parallel.virtual_pipeline_model_parallel_size == middle), key=light_typical)]


def representatives(members: list[Candidate], k: int = REPRESENTATIVES) -> list[Candidate]:
    """Up to ``k`` layouts of one structure: the fastest if it fits, the lightest on memory, the typical one, the
    typical one interleaved (``_interleaved``), then the other typical ones. The same structure can be best at a
    large micro-batch without recompute (Qwen3-30B-A3B / 256 H100) or only with recompute and small micro-batches
    (GPT-3 175B / 1024 A100): without the first two, the Qwen3 optimum's structure ranked 12th, without the typical
    ones GPT-3's ranked last."""
    picks: list[Candidate] = []
    typical = sorted(members, key=_typical)
    for c in [min(members, key=_fast), min(members, key=_light)] + typical[:1] + _interleaved(members) + typical:
        if len(picks) >= k:
            break
        if all(c.key != p.key for p in picks):
            picks.append(c)
    return picks


def groups(valid: list[Candidate]) -> dict[tuple, list[Candidate]]:
    out: dict[tuple, list[Candidate]] = {}
    for c in valid:
        out.setdefault(structure(c), []).append(c)
    return out


def next_round(valid: list[Candidate], scores: dict[tuple, float | None], budget: int) -> list[Candidate]:
    """The layouts to simulate next, given ``scores`` (layout key -> first objective, None if it does not
    fit or was rejected) of those simulated so far; [] when the search is done."""
    left = budget - len(scores)
    if left <= 0:
        return []
    if len(valid) <= budget:  # small space: every layout
        return [c for c in valid if c.key not in scores][:left]
    by_structure = groups(valid)
    reps = {s: representatives(m) for s, m in by_structure.items()}
    # every structure's first representative before any second one, the structures in a spread order, so a
    # budget too small for this round still samples the whole range (the fastest layouts first)
    spread = [s for _, s in sorted(((i * _GOLDEN) % 1.0, s) for i, s in enumerate(by_structure))]
    if len(by_structure) * REPRESENTATIVES > budget:  # too many structures for every representative
        todo = _halving(by_structure, reps, spread, scores, budget)
    else:
        todo = [reps[s][i] for i in range(REPRESENTATIVES) for s in spread
                if i < len(reps[s]) and reps[s][i].key not in scores]
    if todo:
        return todo[:left]

    def rank(s: tuple) -> tuple:
        values = [scores[c.key] for c in reps[s] if scores.get(c.key) is not None]
        return (min(values) if values else float("inf"), repr(s))
    out: list[Candidate] = []
    for s in sorted(by_structure, key=rank):
        rest = [c for c in by_structure[s] if c.key not in scores]
        if len(rest) > left:
            # the next structure does not fit whole: this round stops there (a later, worse one might fit, but is
            # not wanted); once nothing else is left to do, its fastest layouts fill the budget
            if not out:
                out = sorted(rest, key=_fast)[:left]
            break
        out += rest
        left -= len(rest)
    return out


def _halving(by_structure: dict, reps: dict, spread: list, scores: dict, budget: int) -> list[Candidate]:
    """Representatives when there are too many structures for all of them (DeepSeek-V3 / 1024 H100: 1266
    structures, 5064 representatives against a budget of 3000: the budget ran out in that round, before any
    structure was simulated whole, and the search ended 10% off). First each structure's typical layout
    (selective recompute, the smallest micro-batch, the middle number of virtual stages where it has them), then, where that fits, its fastest, where it does not, its
    lightest (full recompute); then the other representatives of the best ``k`` structures by those, ``k`` set so
    that they take half of the budget left; the best structures are then simulated whole (``next_round``) with the
    rest. The typical layout comes first since at DeepSeek-V3 / 1024 H100's 2,532 to 7,116 structures (FP8, pipeline
    layouts) the fastest ones (no recompute, the largest micro-batch) almost never fit and took the whole budget.
    Each step depends on the budget and the stored scores only, so a resumed
    search takes the same layouts."""
    fast = {s: reps[s][0] for s in by_structure}  # representatives() puts the fastest first
    # interleaved where the structure can be (``_interleaved``: without it a pipeline structure of an MoE model has
    # no EP overlap, and Qwen3-235B-A22B / 256 H100's optimum structure ranked on 15.2 s instead of 11.0 s)
    typical = {s: (_interleaved(m) or [min(m, key=_typical)])[0] for s, m in by_structure.items()}
    light = {s: min(m, key=_light) for s, m in by_structure.items()}
    todo = [typical[s] for s in spread if typical[s].key not in scores]
    if todo:
        return todo
    tried = {s: [typical[s]] + ([fast[s]] if scores[typical[s].key] is not None else []) for s in spread}
    todo = [c for s in spread for c in tried[s] if c.key not in scores]
    if todo:
        return todo
    # where neither fits, the lightest (full recompute, smallest micro-batch) shows whether the structure can fit
    # at all (DeepSeek-V3 / 1024 H100: its optimum, TP1 PP16 EP8, fits only with full recompute)
    def with_light(picks: list[Candidate], lightest: Candidate) -> list[Candidate]:
        unfit = all(scores[c.key] is None for c in picks)
        return picks + [lightest] if unfit and all(lightest.key != c.key for c in picks) else picks
    tried = {s: with_light(tried[s], light[s]) for s in spread}
    todo = [c for s in spread for c in tried[s] if c.key not in scores]
    if todo:
        return todo
    first_round = len({c.key for picks in tried.values() for c in picks})
    k = max(1, (budget - first_round) // 2 // (REPRESENTATIVES - 1))

    def first(s: tuple) -> tuple:
        values = [scores[c.key] for c in tried[s] if scores[c.key] is not None]
        return (min(values) if values else float("inf"), repr(s))
    return [c for s in sorted(by_structure, key=first)[:k] for c in reps[s] if c.key not in scores]


def stored_scores(study) -> dict[tuple, float | None]:
    """Layout key -> first objective (None: over memory or rejected) of every finished trial."""
    out: dict[tuple, float | None] = {}
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        record = t.user_attrs.get("record")
        config = (record or t.user_attrs).get("config")
        if config is None:
            continue
        key = config_key(config)
        feasible = t.state == TrialState.COMPLETE and record is not None and record.get("fits_memory")
        out[key] = t.values[0] if feasible and t.values else None
    return out


def run_auto(space: SearchSpace, study, store, valid: list[Candidate], budget: int, *, n_jobs: int = 1, profile=None,
             deadline: float | None = None, progress: Callable[[int, int, dict | None], None] | None = None) -> None:
    """Rounds of ``next_round``'s layouts (and of the feature level), each simulated and stored as trials."""
    total = min(budget, len(valid))
    count = [len(stored_scores(study))]

    def on_trials(n: int, best: dict | None = None) -> None:
        count[0] += n
        if progress is not None:
            progress(count[0], total, best)

    def simulate(todo: list[Candidate]) -> bool:
        # layouts of a structure a round before found fitting without recompute: their recompute variants dominated
        records = [t.user_attrs["record"] for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if t.user_attrs.get("record")]
        return bool(todo) and run_exhaustive(space, study, store, todo, n_jobs=n_jobs, profile=profile,
                                             deadline=deadline, on_trials=on_trials, stored_fits=stored_fits(records))
    search_rounds(space, valid, budget, lambda: stored_scores(study), simulate, deadline)


def search_rounds(space: SearchSpace, valid: list[Candidate], budget: int, scores: Callable[[], dict],
                  simulate: Callable[[list[Candidate]], bool], deadline: float | None = None) -> None:
    """The rounds of the default search: ``scores()`` reads the stored scores (layout key -> first objective, None
    where it does not fit), ``simulate(layouts)`` stores them (False: nothing stored, a deadline hit).

    Each round is computed from the scores of the layouts the rounds before it chose (``seen``), and a layout
    already stored is not simulated again: a resumed search goes through the same rounds, those stored before
    the interruption read back instead of simulated, and ends with the same layouts as one that ran through (the
    feature level's budget and steps count the layouts of its own steps, so stored trials of a later step must not
    count before it). benchmarks/search_replay.py replays the rounds on an exhaustive study's scores."""
    seen: dict = {}

    def step(todo: list[Candidate]) -> bool:
        stored = scores()
        missing = [c for c in todo if c.key not in stored]
        if missing:
            if not simulate(missing):
                return False  # nothing stored (a deadline hit)
            stored = scores()
            if any(c.key not in stored for c in missing):
                return False  # a deadline hit during the round: the rest is for a resumed search
        seen.update((c.key, stored[c.key]) for c in todo)
        return bool(todo)

    def running() -> bool:
        return deadline is None or time.monotonic() < deadline
    features = has_features(space)
    first = budget - budget // FEATURE_SHARE if features else budget
    while running():
        todo = next_round(valid, seen, first)
        if not todo or not step(todo):
            break
    if not features or len(seen) < min(first, len(valid)):
        return  # not through the first level (a deadline hit), or the space simulated whole
    if running():
        feature_level(space, valid, budget - len(seen), lambda: seen, step, structure, groups(valid))
    while running():  # budget left: the first level goes on with it
        todo = next_round(valid, seen, budget)
        if not todo or not step(todo):
            return
