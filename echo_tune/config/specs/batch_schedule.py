"""The steady-state global batch of Megatron-LM's ``--step-batch-size-schedule``.

Megatron-LM d98e8a64ddf3 megatron/core/num_microbatches_calculator.py (``_parse_schedule``,
``_parse_numeric_value``): the schedule is space- or comma-separated ``THRESHOLD:BATCH_SIZE`` pairs, thresholds
in samples (tokens when the sequence length is given) with optional K / M / B / T suffixes, sorted by threshold;
the global batch steps up to each entry's size once training passes its threshold. echo-tune simulates one
steady-state step, so it takes the batch of the last entry (the largest threshold), the one Megatron trains at
for the rest of the run. training/arguments.py refuses the schedule together with ``--global-batch-size``.
(``--rampup-batch-size`` is deprecated and ignored at this commit: the step runs at ``--global-batch-size``.)
"""

from __future__ import annotations

from echo_tune.errors import ConfigError

_SUFFIXES = {"T": 10**12, "B": 10**9, "M": 10**6, "K": 10**3}


def _number(raw: str, schedule: str) -> int:
    """``_parse_numeric_value``: an integer with an optional K / M / B / T suffix."""
    text = raw.strip().upper()
    multiplier = _SUFFIXES.get(text[-1:], 1)
    if multiplier != 1:
        text = text[:-1]
    try:
        return int(float(text) * multiplier)
    except ValueError:
        raise ConfigError(f"--step-batch-size-schedule entries must be THRESHOLD:BATCH_SIZE numbers, but got "
                          f"({raw!r} in {schedule!r})") from None


def final_global_batch_size(schedule: str) -> int:
    """The global batch size of the schedule's last entry (largest threshold): its steady state."""
    entries = schedule.strip().replace(",", " ").split()
    pairs = []
    for entry in entries:
        if ":" not in entry:
            raise ConfigError(f"--step-batch-size-schedule entries must be THRESHOLD:BATCH_SIZE, but got "
                              f"({entry!r} in {schedule!r}); write e.g. '0:384 200B:768'")
        threshold, batch = entry.split(":", 1)
        pairs.append((_number(threshold, schedule), _number(batch, schedule)))
    if not pairs:
        raise ConfigError("--step-batch-size-schedule needs at least one THRESHOLD:BATCH_SIZE entry, but got none")
    batch = max(pairs, key=lambda pair: pair[0])[1]
    if batch <= 0:
        raise ConfigError(f"`batch size > 0` must hold in --step-batch-size-schedule, but got ({schedule!r})")
    return batch
