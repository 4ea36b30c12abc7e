"""A search space checked whole: every valid layout (bounded), the rule broken most often where none is valid, and
the searched values no valid layout takes (search/space/layouts.py enumerates them)."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Iterable

from echo_tune.errors import ConfigError
from echo_tune.limits import MAX_VALID_LAYOUTS
from echo_tune.search.engines.gc_pause import gc_paused
from echo_tune.search.space.layouts import Candidate, enumerate_layouts, setting
from echo_tune.search.space.search_space import SearchSpace


def rule_name(rule: str) -> str:
    """The rule part of a check_compatible message (before the offending values)."""
    return rule.split(", but got")[0].split(" (")[0]


def check_space(space: SearchSpace) -> tuple[list[Candidate], list[str]]:
    """All valid layouts and notes on the space; ConfigError if it holds no valid layout."""
    stats: Counter = Counter()
    with gc_paused():
        valid = list(itertools.islice(enumerate_layouts(space, stats), MAX_VALID_LAYOUTS + 1))
    if len(valid) > MAX_VALID_LAYOUTS:  # bounded work (issue 10): stop before minutes of silence
        raise ConfigError(f"search space {space.source or space.name!r} holds more than {MAX_VALID_LAYOUTS} valid "
                          f"layouts ({space.product_size} combinations); list fewer values instead of `auto` "
                          f"(e.g. micro_batch_size, num_gpus) or split the space")
    if not valid:
        by_rule = Counter()
        for rule, n in stats.items():
            by_rule[rule_name(rule)] += n
        top, n = by_rule.most_common(1)[0] if by_rule else ("(none)", 0)
        example = next(r for r in stats if rule_name(r) == top) if by_rule else ""
        raise ConfigError(f"search space {space.source or space.name!r} holds no valid layout; the rule broken "
                          f"most often ({n} of {sum(stats.values())} rejections) is: {example}")
    return valid, unused_notes(space, used_values(space, valid))


def used_values(space: SearchSpace, candidates: Iterable[Candidate]) -> dict[str, set]:
    """The values each searched setting takes in ``candidates``."""
    # read off the settings (not ``c.config``: building 43k config dicts cost ~2 s of a 43k-layout space)
    return {f: {setting(c, f) for c in candidates} for f in space.searched}


def unused_notes(space: SearchSpace, used: dict[str, set]) -> list[str]:
    """Notes on the searched values no valid layout takes (``used``: ``used_values`` of every valid layout)."""
    notes = []
    for field_name in space.searched:
        unused = [v for v in space.choices[field_name] if v not in used[field_name]]
        if unused:
            notes.append(f"{field_name} value(s) {unused} appear in no valid layout")
    return notes
