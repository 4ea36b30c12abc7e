"""Every layout of a study accounted for exactly once (issue 41 item 2).

A study's finished trials (COMPLETE or PRUNED) each name one layout: the simulated record's ``config``, the
``config`` a dominated or rejected trial stores, or a sampler's params. ``account`` counts each layout once,
says which were stored more than once (a killed or concurrent run of an older version could do that), and,
given the space's valid layouts, which were never stored. The summary's ``coverage`` counts distinct layouts,
and a run that should have covered the space but did not names the missing ones (``missing_note``).

``fail_dead_running`` is what a resumed run does first: a RUNNING trial whose worker is gone (a SIGKILLed
search; ``claim.WORKER_ATTR`` names it) is told FAIL, as Optuna's own ``fail_stale_trials`` does, so its layout
is asked again instead of being taken for one in flight.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from operator import itemgetter
from dataclasses import dataclass, field

from optuna.trial import FrozenTrial, TrialState

from echo_tune.search.storage.claim import WORKER_ATTR, claim, worker_alive
from echo_tune.search.space.labels import full_label
from echo_tune.search.space.layouts import RejectedLayout
from echo_tune.search.space.params import layout_of
from echo_tune.search.space.layouts import TUPLE_FIELDS

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
NAMED = 8
"""Layouts named in a note; the rest are counted."""


def trial_config(trial: FrozenTrial, space=None) -> dict | None:
    """The layout a finished trial stands for, by Megatron setting (None when it names none)."""
    record = trial.user_attrs.get("record")
    if isinstance(record, dict) and isinstance(record.get("config"), dict):
        return record["config"]
    config = trial.user_attrs.get("config")
    if isinstance(config, dict):
        return config
    if trial.params and space is not None:
        try:
            return layout_of(space, trial.params).config
        except (RejectedLayout, KeyError):
            return None
    return None


_ORDER: dict[int, tuple] = {}
_NAMES: list[tuple] = []


def layout_key(config: dict) -> tuple:
    """A layout's identity, as ``layouts.config_key`` but ~4x cheaper (a config holds ~75 settings, and a study
    tens of thousands of trials): the settings' values in name order, the names' order sorted once per number
    of settings (a config with as many settings that holds every one of those names has the same names). Compare
    it only with other ``layout_key``s."""
    order = _ORDER.get(len(config))
    if order is not None:
        try:
            return order[0], _hashable(order[1](config), order[2])
        except KeyError:
            pass
    ordered = tuple(sorted(config))
    if ordered not in _NAMES:
        _NAMES.append(ordered)
    getter = itemgetter(*ordered) if len(ordered) > 1 else (lambda c: tuple(c[n] for n in ordered))

    lists = tuple(i for i, name in enumerate(ordered) if name in TUPLE_FIELDS)
    order = _ORDER[len(config)] = (_NAMES.index(ordered), getter, lists)
    return order[0], _hashable(order[1](config), lists)


def _hashable(values: tuple, positions: tuple) -> tuple:
    """``values`` with the module sets a stored trial's JSON gave back as lists (at ``positions``) as tuples."""
    if any(type(values[i]) is list for i in positions):
        values = tuple(tuple(v) if type(v) is list else v for v in values)
    return values


def key_config(key: tuple) -> dict:
    """The settings of a ``layout_key``."""
    return dict(zip(_NAMES[key[0]], key[1]))


def candidate_key(candidate) -> tuple:
    return layout_key(candidate.config)


def trial_key(trial: FrozenTrial, space=None) -> tuple | None:
    config = trial_config(trial, space)
    return None if config is None else layout_key(config)


@dataclass
class Accounting:
    """What the finished trials cover: ``distinct`` layouts, those stored more than once, those missing."""
    finished: int = 0
    distinct: int = 0
    duplicates: dict[tuple, int] = field(default_factory=dict)
    """Layout key -> how many finished trials hold it (only those held more than once)."""
    missing: list[tuple] = field(default_factory=list)
    """Valid layouts no finished trial holds and no live worker is simulating (only when the valid layouts were
    given)."""
    in_flight: int = 0
    """Valid layouts not finished yet that a live worker is simulating now (another process on the study)."""
    configs: dict[tuple, dict] = field(default_factory=dict)

    @property
    def n_duplicates(self) -> int:
        """Finished trials beyond the first of their layout."""
        return sum(n - 1 for n in self.duplicates.values())

    def label(self, key: tuple) -> str:
        return full_label(self.configs.get(key) or key_config(key))

    def labels(self, keys) -> str:
        keys = list(keys)
        named = "; ".join(self.label(k) for k in keys[:NAMED])
        return named + (f"; and {len(keys) - NAMED} more" if len(keys) > NAMED else "")


def account(trials: list[FrozenTrial], valid=None, space=None) -> Accounting:
    """Count ``trials``' finished layouts once each; ``valid`` (the space's Candidates, or None): also name the
    valid layouts none holds."""
    counts: Counter = Counter()
    out = Accounting()
    unnamed = rejected = 0
    running = set()
    for t in trials:
        if t.state == TrialState.RUNNING and valid is not None and t.params and \
                worker_alive(t.user_attrs.get(WORKER_ATTR)):
            running.add(trial_key(t, space))
        if t.state not in FINISHED:
            continue
        out.finished += 1
        key = trial_key(t, space)
        if key is None:
            unnamed += 1  # stored by a version that kept no config: counted, not compared
            continue
        counts[key] += 1
        rejected += "rejected_rule" in t.user_attrs
    out.distinct = len(counts) + unnamed
    out.duplicates = {k: n for k, n in counts.items() if n > 1}
    # as many layouts as the space holds and none rejected: each is one of the space's (enumerated, or proposed
    # by a sampler that proposes valid layouts only), so none is missing; the pass below costs ~4 us a layout
    if valid is not None and not unnamed and (len(counts) != len(valid) or rejected or running):
        for c in valid:
            key = candidate_key(c)
            if key in running:
                out.in_flight += 1
            elif key not in counts:
                out.missing.append(key)
                out.configs[key] = c.config
    for key in out.duplicates:
        out.configs.setdefault(key, key_config(key))
    return out


def duplicate_note(acc: Accounting) -> str | None:
    if not acc.duplicates:
        return None
    return (f"{len(acc.duplicates)} layout(s) are stored more than once ({acc.n_duplicates} extra trial(s), counted once "
            f"in the coverage): {acc.labels(acc.duplicates)}")


def missing_note(acc: Accounting) -> str | None:
    if not acc.missing:
        return None
    return (f"{len(acc.missing)} valid layout(s) were never simulated: {acc.labels(acc.missing)}; run the search "
            f"again with --resume to simulate them")


def in_flight_note(acc: Accounting) -> str | None:
    if not acc.in_flight:
        return None
    return (f"{acc.in_flight} layout(s) of the space are still being simulated by another live worker of this "
            f"study; run the search again with --resume once it ends to gather them")


UNSTAMPED_GRACE_S = 60.0
"""A RUNNING trial with no worker stamp younger than this may be one a worker asked a moment ago on a storage
without a cross-process claim (MySQL, Redis: ``claim.py``); older, it is a leftover."""


def dead_running(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """RUNNING trials whose worker (``claim.WORKER_ATTR``) is gone: leftovers of a killed run."""
    now = datetime.now()
    out = []
    for t in trials:
        if t.state != TrialState.RUNNING:
            continue
        worker = t.user_attrs.get(WORKER_ATTR)
        if worker is None and t.datetime_start is not None and \
                (now - t.datetime_start).total_seconds() < UNSTAMPED_GRACE_S:
            continue
        if not worker_alive(worker):
            out.append(t)
    return out


def fail_dead_running(study, store) -> int:
    """Tell FAIL every RUNNING trial of a dead worker (under the storage's claim, so a live worker's trial
    asked a moment ago is never taken for one); returns how many."""
    failed = 0
    with claim(store):
        for t in dead_running(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))):
            try:
                if study._storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                    failed += 1
            except Exception:  # noqa: BLE001 - finished by its worker meanwhile (UpdateFinishedTrialError)
                continue
    return failed
