"""``echo-tune profile``: time every op the database lacks for this device, committing each at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from echo_tune.optime.collect import OpInstance
from echo_tune.optime.db import Measurement, OpTimeDB
from echo_tune.optime.device import DeviceInfo
from echo_tune.optime.measure import measure_key

Progress = Callable[[int, int, OpInstance, Measurement], None]


@dataclass(frozen=True, kw_only=True)
class ProfileResult:
    device: str
    total: int
    """Distinct ops of the layouts."""
    already: int
    """Of those, found in the database (a resumed or repeated run)."""
    measured: int
    """Measured by this run."""
    measured_time_s: float
    """Sum of the measured ops' median times (one call each)."""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def profile_ops(ops: list[OpInstance], db: OpTimeDB, device: torch.device, info: DeviceInfo, *,
                progress: Progress | None = None, **options) -> ProfileResult:
    """Measure the ops of ``ops`` not yet in ``db`` for ``info``; each row is committed as it is measured,
    so an interruption (Ctrl-C, a crash) loses at most the op in flight."""
    known = db.known_keys(info)
    todo = [op for op in ops if op.key not in known]
    total_s = 0.0
    for i, op in enumerate(todo, 1):
        measurement = measure_key(op.key, device, **options)
        db.add(info, op.key, measurement)
        total_s += measurement.time_s
        if progress is not None:
            progress(i, len(todo), op, measurement)
    return ProfileResult(device=info.name, total=len(ops), already=len(ops) - len(todo), measured=len(todo),
                         measured_time_s=total_s)
