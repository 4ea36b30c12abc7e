"""An exhaustive study that search_quality.py kept (``--results-dir``), read line by line from its journal: not a test.

Optuna's JournalStorage replays the whole log into memory (the DeepSeek-V3 recipe space's study, 159,888 trials
with their records, is a 1.2 GB journal); the benchmarks need only each layout's first objective, so they read
the lines themselves. Trials are Optuna's CREATE_TRIAL records (op code 4) as the exhaustive search stores them
(search/storage/journal_trials.py): COMPLETE with the simulated ``record``, PRUNED with ``dominated_by`` and the
``config`` (a dominated layout) or the rule that rejected it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.search.space.dominance import DOMINATED_BY_RECOMPUTE, OVER_MEMORY, config_group_key
from echo_tune.search.space.layouts import config_key

_CREATE_TRIAL, _COMPLETE, _PRUNED = 4, 1, 2


@dataclass
class StoredStudy:
    layouts: int = 0
    """Finished trials (the exhaustive study: one per valid layout)."""
    simulated: int = 0
    """Of them, simulated (not dominated)."""
    optimum_s: float = float("inf")
    truth: dict = field(default_factory=dict)
    """``hash(config_key)`` -> first objective (None: over memory or rejected); a layout dominated by its twin
    without recompute has the twin's time, a lower bound of its own (search_replay.py)."""


def exhaustive_journal(results: Path, space_name: str) -> Path:
    """The journal of the space's exhaustive study in ``results`` (any process count)."""
    for path in sorted(results.glob(f"{space_name}-exhaustive-*")):
        if (path / "journal.log").exists():
            return path / "journal.log"
    raise SystemExit(f"no exhaustive study of {space_name} in {results}")


def read_study(journal: Path, truth: bool = False) -> StoredStudy:
    out = StoredStudy()
    fits: dict = {}
    dominated: list[dict] = []
    with open(journal, encoding="utf-8") as lines:
        for line in lines:
            if not line.startswith('{"op_code":4'):
                continue
            trial = json.loads(line)
            if trial["op_code"] != _CREATE_TRIAL:
                continue
            out.layouts += 1
            attrs = trial.get("user_attrs") or {}
            record = attrs.get("record")
            if trial["state"] == _COMPLETE and record is not None:
                out.simulated += 1
                value = (trial.get("values") or [trial.get("value")])[0] if record.get("fits_memory") else None
                if value is not None:
                    out.optimum_s = min(out.optimum_s, value)
                if truth:
                    out.truth[hash(config_key(record["config"]))] = value
                    if value is not None and record["config"].get("recompute_granularity") is None:
                        fits[hash(config_group_key(record["config"]))] = value
            elif attrs.get("dominated_by") in (None, OVER_MEMORY):
                # rejected by a rule, or over memory by its memory alone: counted as simulated, as the search's
                # summary does (``SearchResult.n_simulated``); neither fits
                out.simulated += 1
                if truth and attrs.get("config"):
                    out.truth[hash(config_key(attrs["config"]))] = None
            elif truth and attrs.get("config"):
                dominated.append(attrs)
    for attrs in dominated:
        twin = fits.get(hash(config_group_key(attrs["config"]))) \
            if attrs["dominated_by"] == DOMINATED_BY_RECOMPUTE else None
        out.truth[hash(config_key(attrs["config"]))] = twin
    return out
