"""The default search's second level (feature_variants.py says why there are two): which layouts, in four steps.

1. **sweep** - the dispatcher's kernels and the FP8 recipe (``SWEEP_FIELDS``) for the best layout of each recompute
   granularity of each of the best ``SWEEP_SHARE`` x ``FEATURE_TOP`` structures (first level's scores);
2. **combinations** - every combination of the features for the best layout of each of the best ``FEATURE_TOP``;
3. **batch settings again** - the best structures after both, in the order of their best layout, each whole (every
   virtual pipeline size, recompute setting, micro-batch, overlap of it) with that layout's features
   (``rebatch``), at most half of the level's budget left at a time. The first level searched a structure's
   batch settings with the lead features only, and those that suit one set of features can differ from another's:
   on Qwen3-235B-A22B / 256 H100 the optimum's structure (TP2 PP4 EP32) was best on its lead features (DeepEP,
   current scaling) at eight virtual stages, and the sweep changed the features of that layout only: 10.35 s with
   HybridEP and delayed scaling, 0.6% off the optimum, the same at four virtual stages (10.28 s);
4. **again** - the sweep for the best layouts step 3 found, then step 3 for what that sweep found, until neither
   finds a layout not simulated yet or the budget is spent.

Each step is computed from the scores of the layouts the steps before it chose (``scores()``: layout key -> first
objective, None where it does not fit; auto.search_rounds keeps them), so a resumed search takes the same layouts;
``simulate(layouts)`` stores them.
"""

from __future__ import annotations

from collections.abc import Callable

from echo_tune.search.engines.feature_variants import (SWEEP_FIELDS, SWEEP_PER, SWEEP_SHARE, feature_round,
                                                       with_features)
from echo_tune.search.space.layouts import Candidate
from echo_tune.search.space.search_space import SearchSpace

FEATURE_TOP = 8
"""Structures whose best layout gets every combination of the recipe features."""

SWEEP_CAP = 2
"""The first sweep takes at most 1 / SWEEP_CAP of the level's budget, the combinations at most half of the rest,
so that steps 3 and 4 keep at least a quarter."""


def feature_level(space: SearchSpace, valid: list[Candidate], cap: int, scores: Callable[[], dict],
                  simulate: Callable[[list[Candidate]], object], structure: Callable, members: dict) -> None:
    """The steps above within ``cap`` layouts; ``valid``: the first level's layouts (lead features), ``members``:
    those by ``structure``. After the batch settings, the sweep again for the best layouts they found (of each
    recompute granularity: DeepSeek-V3's best structures fit at the first level only with selective recompute of
    every module, and recomputing moe_act rules out delayed FP8 scaling, so no layout without recompute had been
    swept), then the
    batch settings again, until neither finds a layout not simulated or the budget is spent."""
    tried: list[Candidate] = []

    def run(todo: list[Candidate]) -> list[Candidate]:
        simulate(todo)
        tried.extend(todo)
        return todo
    run(feature_round(space, valid, scores(), SWEEP_SHARE * FEATURE_TOP, cap // SWEEP_CAP, structure,
                      fields=SWEEP_FIELDS, per=SWEEP_PER))
    run(feature_round(space, valid, scores(), FEATURE_TOP, (cap - len(tried)) // 2, structure, known=tried))
    while len(tried) < cap:
        # half of what is left at a time, so that a sweep follows (DeepSeek-V3 / 1024 H100's zero-YAML space: its
        # best structures hold a dozen batch settings each, which took the rest of the budget before any was swept)
        batch = run(rebatch(space, tried, scores(), max(1, (cap - len(tried)) // 2), structure, members))
        swept = run(feature_round(space, batch, scores(), SWEEP_SHARE * FEATURE_TOP, cap - len(tried), structure,
                                  fields=SWEEP_FIELDS, per=SWEEP_PER))
        if not batch and not swept:
            break


def rebatch(space: SearchSpace, tried: list[Candidate], scores: dict, cap: int, structure: Callable,
            members: dict) -> list[Candidate]:
    """Up to ``cap`` layouts not yet simulated: the structures of the fitting layouts among ``tried`` (feature
    variants), best first, each with all its batch settings (``members[structure]``, lead features) at the
    features of its best layout in ``tried``; whole structures while they fit in ``cap``, then the next one's
    layouts in ``members``' order up to ``cap``."""
    fitting = sorted((scores[c.key], i) for i, c in enumerate(tried) if scores.get(c.key) is not None)
    out: list[Candidate] = []
    seen_keys: set[tuple] = set()
    done: set[tuple] = set()
    for _, i in fitting:
        best = tried[i]
        s = structure(best)
        if s in done:
            continue
        done.add(s)
        rest = []
        for c in with_features(space, members.get(s, []), best):
            if c.key not in scores and c.key not in seen_keys:
                seen_keys.add(c.key)
                rest.append(c)
        left = cap - len(out)
        out += rest[:left]
        if len(rest) >= left:
            break
    return out

