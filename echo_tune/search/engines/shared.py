"""Many workers, one exhaustive study: layouts handed out in batches through claim tickets.

With an RDB storage (``--storage postgresql://...``, MySQL, SQLite), every ``echo-tune search --sampler
exhaustive --resume`` started on the same study is a worker. Beside the study ``NAME`` the storage holds
a study ``NAME:batches`` of *tickets*, one per batch of layouts (indices into the space's enumeration).

* The worker that creates ``NAME:batches`` (the storage lets exactly one create a study name) enqueues a
  ticket for every batch of layouts the study does not hold yet, then marks the ticket study ready;
  the others wait for that mark.
* A worker claims a ticket by moving it from WAITING to RUNNING, which Optuna's RDB storage does under a
  row lock (``set_trial_state_values`` returns False to every other claimant), simulates its layouts,
  stores them as finished trials of ``NAME`` and completes the ticket. So no layout is simulated or
  stored twice, and none is left out while the workers run to the end.
* A worker stops when no ticket is waiting (or at ``--timeout``, after its current batch; the
  remaining tickets wait for the next worker).

A worker killed mid-batch leaves its ticket RUNNING: search/engines/tickets.py (which runs the shared exhaustive search
now, with this module's tickets) re-issues it once its worker is gone or silent.
"""

from __future__ import annotations

import time

import optuna
from optuna.exceptions import DuplicatedStudyError

from echo_tune.errors import ConfigError
from echo_tune.search.space.dominance import ordered_groups
from echo_tune.search.engines.exhaustive import cut, structure_key
from echo_tune.search.space.layouts import Candidate

CLAIMS_SUFFIX = ":batches"
READY_ATTR = "tickets"

def ticket_size(layouts: int) -> int:
    """Layouts per ticket: about 64 tickets (workers even out), 4 to 32 layouts each (writes batch)."""
    return max(4, min(32, layouts // 64))

READY_WAIT_S = 600.0


def shares_work(storage_url: str | None) -> bool:
    """Whether ``--storage`` names a database that several workers can share (an RDB URL)."""
    return storage_url is not None and "://" in storage_url and not storage_url.startswith("redis://")


def _open_tickets(storage, name: str, valid: list[Candidate], todo: list[Candidate]):
    try:
        tickets = optuna.create_study(study_name=name, storage=storage)
    except DuplicatedStudyError:
        tickets = optuna.load_study(study_name=name, storage=storage)
        waited = time.monotonic() + READY_WAIT_S
        while READY_ATTR not in tickets.user_attrs:
            if time.monotonic() > waited:
                raise ConfigError(f"study {name!r} was created but never filled with tickets (its creator "
                                  f"stopped?); delete it (optuna delete-study) and start the workers again")
            time.sleep(0.2)
        return tickets
    index = {c.key: i for i, c in enumerate(valid)}
    ordered = sorted(todo, key=structure_key)  # a ticket's layouts share pipeline programs and traces
    # a layout's recompute variants in one ticket, after it (dominance.py: they need it simulated first)
    parts = cut(ordered_groups(ordered), ticket_size(len(ordered)))
    for part in parts:
        tickets.enqueue_trial({}, user_attrs={"layouts": [index[c.key] for c in part]})
    tickets.set_user_attr(READY_ATTR, len(parts))
    return tickets
