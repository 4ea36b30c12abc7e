"""Whether a sampling search (TPE, random, ...) saw every structure of its space before it recommends one.

A structure is a layout's GPU count, TP, PP, CP, EP / ETP, uneven split and FP8 (``auto.STRUCTURE_FIELDS``): the
choices that decide which GPU count and parallel shape win; the default ``auto`` search simulates every one at a
few layouts, an exhaustive one all of them. A sampling search with fewer trials than structures cannot compare
them, and a 5-trial search once recommended 512 GPUs where 993 layouts fit on 256: it says so before its result.
"""

from __future__ import annotations

from echo_tune.search.storage.accounting import trial_config
from echo_tune.search.engines.auto import STRUCTURE_FIELDS, structure


def _of_config(config: dict) -> tuple:
    return tuple(config.get(f) for f in STRUCTURE_FIELDS)


def short_search_note(space, trials, valid) -> str | None:
    """A note when the finished trials cover fewer structures (and GPU counts) than the space holds, else None."""
    if not valid:
        return None
    every = {structure(c) for c in valid}
    seen = set()
    for trial in trials:
        config = trial_config(trial, space)
        if config is not None:
            seen.add(_of_config({**config, "num_gpus": config.get("num_gpus")}))
    seen &= every
    if len(seen) >= len(every):
        return None
    gpus_all = sorted({s[0] for s in every})
    gpus_seen = sorted({s[0] for s in seen})
    counts = (f"; GPU counts {', '.join(map(str, gpus_seen)) or 'none'} of {', '.join(map(str, gpus_all))}"
              if len(gpus_all) > 1 else "")
    return (f"short search: its trials reached {len(seen)} of the {len(every)} structures of the space (GPU count, "
            f"TP, PP, CP, EP/ETP, uneven split, FP8){counts}; another structure or GPU count may be faster: run the "
            f"default search (--sampler auto) or more trials before choosing one")
