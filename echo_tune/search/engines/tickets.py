"""Claims of batches that outlive their worker are re-issued (issue 41 item 2; ``shared.py`` hands them out).

The exhaustive search on a database shares its layouts out as tickets (``shared.py``): a worker claims one
(WAITING -> RUNNING under the database's row lock), simulates its layouts, stores them and completes it. A
worker killed mid-batch left its ticket RUNNING forever and its layouts missing; the gathering run said
coverage 0.996 and exited 0. Now:

* a claim carries its claimant (``host:pid``) and a heartbeat: a counter its worker raises every
  ``claim.HEARTBEAT_S`` seconds while it simulates the batch;
* a worker with no ticket left to claim does not stop while another's claim is open: a claim whose claimant
  is gone (on this host: its process no longer exists; on another: its heartbeat has not moved for
  ``LEASE_S`` seconds, timed here, so the hosts' clocks need not agree) is re-issued, i.e. told FAIL and
  replaced by a WAITING ticket with the same layouts, which the next free worker claims; a live claim is
  waited for;
* once no claim is open, the layouts of the run still missing from the study (a claimant killed between
  re-issuing a claim and enqueuing its replacement, say) are enqueued as tickets too.

The re-issuing and the final check run under the storage's cross-process lock (``claim.claim``: PostgreSQL's
advisory lock, SQLite's ``flock``), so two workers never re-issue one claim twice. A re-issued ticket's
layouts may be partly stored already: its batch is simulated whole (a layout's recompute variants are judged
against it, ``dominance.py``, as in a one-process run) and only the layouts not yet stored are stored. So
every layout of the study is stored exactly once, and the gathering run ends with all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from echo_tune.search.storage.accounting import candidate_key, trial_key
from echo_tune.search.storage.claim import beating, claim, same_host, worker_alive, worker_id
from echo_tune.search.space.dominance import ordered_groups
from echo_tune.search.engines.exhaustive import cut, run_exhaustive, structure_key
from echo_tune.search.space.layouts import Candidate
from echo_tune.search.engines.shared import CLAIMS_SUFFIX, _open_tickets, ticket_size

CLAIMANT_ATTR = "claimant"
HEARTBEAT_ATTR = "heartbeat"
REISSUED_ATTR = "reissued"
"""On a replacement ticket: the number of the ticket it replaces (or -1: layouts found missing)."""
LEASE_S = 60.0
"""A claim on another host whose heartbeat has not moved this long (timed here) is taken for dead."""
POLL_S = 0.5


class _Watch:
    """When this process first saw each open claim's heartbeat at its current value (``time.monotonic``)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[object, float]] = {}
        self.enqueued_missing: set = set()
        """Layouts this worker found missing and enqueued: found missing again, they are left to the summary."""

    def stale(self, ticket) -> bool:
        claimant = ticket.user_attrs.get(CLAIMANT_ATTR)
        if claimant is not None and same_host(claimant):
            return not worker_alive(claimant)
        beat = (claimant, ticket.user_attrs.get(HEARTBEAT_ATTR))
        now = time.monotonic()
        last = self._seen.get(ticket._trial_id)
        if last is None or last[0] != beat:
            self._seen[ticket._trial_id] = (beat, now)
            return False
        return now - last[1] > LEASE_S


def _claim(storage, study_id: int):
    """A waiting ticket, now RUNNING and stamped with this worker; None when none is waiting."""
    for ticket in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.WAITING,)):
        try:
            if storage.set_trial_state_values(ticket._trial_id, state=TrialState.RUNNING):
                storage.set_trial_user_attr(ticket._trial_id, CLAIMANT_ATTR, worker_id())
                storage.set_trial_user_attr(ticket._trial_id, HEARTBEAT_ATTR, 0)
                return ticket
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker claimed and finished it meanwhile
    return None


def _heartbeat(storage, trial_id: int):
    """Raise the ticket's heartbeat every ``HEARTBEAT_S`` while the block runs (a thread of this process; a ticket
    re-issued meanwhile, taken for dead, ends it)."""
    return beating(lambda n: storage.set_trial_user_attr(trial_id, HEARTBEAT_ATTR, n))


def stored_keys(study) -> set:
    return {k for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
            if (k := trial_key(t)) is not None}


def _enqueue(tickets, layouts: list[int], reissued: int) -> None:
    tickets.enqueue_trial({}, user_attrs={"layouts": layouts, REISSUED_ATTR: reissued, "reissued_by": worker_id()})


def _settle(study, store, tickets, valid: list[Candidate], todo: list[Candidate], watch: _Watch) -> str:
    """No ticket was waiting: re-issue dead claims, and once none is open enqueue the run's missing layouts.
    Returns ``"work"`` (a ticket is waiting now), ``"wait"`` (live claims are open) or ``"done"``."""
    storage, study_id = store.storage, tickets._study_id
    with claim(store):
        trials = storage.get_all_trials(study_id, deepcopy=False)
        if any(t.state == TrialState.WAITING for t in trials):
            return "work"
        live = False
        for t in trials:
            if t.state != TrialState.RUNNING:
                continue
            if not watch.stale(t):
                live = True
                continue
            try:
                storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # its claimant finished it after all
            _enqueue(tickets, list(t.user_attrs["layouts"]), t.number)
            return "work"
        if live:
            return "wait"
        have = stored_keys(study)
        index = {c.key: i for i, c in enumerate(valid)}
        missing = [c for c in todo if candidate_key(c) not in have]
        if not missing or {candidate_key(c) for c in missing} <= watch.enqueued_missing:
            return "done"  # (the second case: simulated and still not stored; the summary names them)
        watch.enqueued_missing |= {candidate_key(c) for c in missing}
        ordered = sorted(missing, key=structure_key)
        for part in cut(ordered_groups(ordered), ticket_size(len(ordered))):
            _enqueue(tickets, [index[c.key] for c in part], -1)
        return "work"


def run_shared_exhaustive(space, study, store, valid: list[Candidate], todo: list[Candidate], *, n_jobs: int = 1,
                          profile=None, deadline: float | None = None,
                          on_trials: Callable[[int, dict | None], None] | None = None) -> int:
    """Claim batches of layouts until every layout of the run is stored (re-issuing dead workers' claims, waiting
    for live ones); returns how many trials this worker stored. At ``deadline`` it stops after its batch."""
    storage = store.storage
    tickets = _open_tickets(storage, study.study_name + CLAIMS_SUFFIX, valid, todo)
    study_id = tickets._study_id
    watch = _Watch()
    stored = 0
    while deadline is None or time.monotonic() < deadline:
        ticket = _claim(storage, study_id)
        if ticket is None:
            state = _settle(study, store, tickets, valid, todo, watch)
            if state == "done":
                break
            if state == "wait":
                time.sleep(POLL_S)
            continue
        batch = [valid[i] for i in ticket.user_attrs["layouts"]]
        keep = None
        if ticket.user_attrs.get(REISSUED_ATTR) is not None:  # partly stored by the claimant it replaces?
            have = stored_keys(study)
            keep = lambda t: trial_key(t) not in have  # noqa: E731
        with _heartbeat(storage, ticket._trial_id):
            stored += run_exhaustive(space, study, store, batch, n_jobs=n_jobs, profile=profile,
                                     on_trials=on_trials, keep=keep)
        try:
            storage.set_trial_state_values(ticket._trial_id, state=TrialState.COMPLETE, values=[0.0])
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # re-issued meanwhile (this worker was taken for dead): its replacement stores what is left
    return stored
