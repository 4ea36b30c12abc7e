"""What a resumed search says about itself: the settings it changed, and the best layout it already holds."""

from __future__ import annotations

from collections.abc import Callable

from echo_tune.search.engines.sampler import SAMPLERS


def resume_notes(study, sampler: str, seed: int | None, done_before: int) -> list[str]:
    """Notes for a run that continues ``study`` (holding ``done_before`` finished trials) with ``sampler`` and
    ``seed``: allowed, but said where they differ from the study's first run."""
    notes = []
    first = study.user_attrs.get("sampler")
    if first is not None and first != sampler:
        notes.append(f"resumed a study whose first {done_before} trials came from the {first!r} sampler; "
                     f"this run continued it with {sampler!r}")
    first_seed = study.user_attrs.get("seed", seed)  # studies of older versions did not store it
    if first_seed != seed and SAMPLERS.get(sampler) is not None:  # auto and exhaustive take no random draw
        notes.append(f"resumed a study begun with --seed {first_seed} at --seed {seed}: the {sampler!r} sampler's "
                     f"new draws follow the new seed, so the study is not the one either seed gives uninterrupted")
    return notes


def with_stored_best(progress: Callable | None, stored: tuple[int, dict] | None) -> Callable | None:
    """``progress(done, total, record)`` that is first shown the best layout a resumed study already holds
    (``stored``: (trial number, record)), so a progress line's best is the study's, not the new trials' only."""
    if progress is None or stored is None:
        return progress
    pending = [stored[1]]

    def shown(done: int, total: int | None, record: dict | None) -> None:
        if pending[0] is not None:
            first, pending[0] = pending[0], None
            progress(done, total, first)
        progress(done, total, record)
    return shown
