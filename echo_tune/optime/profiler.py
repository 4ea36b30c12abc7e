"""``echo-tune profile``: time every op the database lacks for this device, committing each at once."""

from __future__ import annotations

from collections.abc import Callable
import dataclasses
from dataclasses import dataclass

import torch

from echo_tune.config.cluster import ClusterSpec
from echo_tune.config.model import ModelSpec
from echo_tune.config.parallel import ParallelConfig
from echo_tune.optime.collect import OpInstance, distinct_ops
from echo_tune.optime.host import host_time_s
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
    host_overhead_s: float | None = None
    """Framework host time per op (``optime/host.py``), when measured."""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def profile_ops(ops: list[OpInstance], db: OpTimeDB, device: torch.device, info: DeviceInfo, *,
                progress: Progress | None = None, **options) -> ProfileResult:
    """Measure the ops of ``ops`` not yet in ``db`` for ``info``; each row is committed as it is measured,
    so an interruption (Ctrl-C, a crash) loses at most the op in flight."""
    known = db.known_keys(info)
    todo = [op for op in ops if op.key not in known]
    total_s = 0.0
    flush_denormal = torch.set_flush_denormal(True)  # as emulate runs (GPUs do not slow down on them)
    try:
        total_s = _measure(todo, db, device, info, progress, options)
    finally:
        if flush_denormal:
            torch.set_flush_denormal(False)
    return ProfileResult(device=info.name, total=len(ops), already=len(ops) - len(todo), measured=len(todo),
                         measured_time_s=total_s)


def _measure(todo, db, device, info, progress, options) -> float:
    total_s = 0.0
    for i, op in enumerate(todo, 1):
        measurement = measure_key(op.key, device, **options)
        db.add(info, op.key, measurement)
        total_s += measurement.time_s
        if progress is not None:
            progress(i, len(todo), op, measurement)
    return total_s


def profile_layouts(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, layouts: list[ParallelConfig],
                    db: OpTimeDB, device: torch.device, info: DeviceInfo, *, progress: Progress | None = None,
                    **options) -> ProfileResult:
    """Measure the distinct ops of ``layouts`` that ``db`` lacks, then the host overhead per op."""
    result = profile_ops(distinct_ops(model, cluster, num_gpus, layouts), db, device, info, progress=progress,
                         **options)
    seen, total_s, total_ops = set(), 0.0, 0
    for parallel in layouts:
        shape = (parallel.tensor_model_parallel_size, parallel.context_parallel_size, parallel.sequence_parallel,
                 parallel.micro_batch_size, parallel.precision)
        if shape not in seen:
            seen.add(shape)
            seconds, ops = host_time_s(model, cluster, num_gpus, parallel)
            total_s, total_ops = total_s + seconds, total_ops + ops
    overhead = total_s / max(total_ops, 1)
    db.set_host_overhead(info, overhead, total_ops)
    return dataclasses.replace(result, host_overhead_s=overhead)
