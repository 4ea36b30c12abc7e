"""``echo-tune profile``: measure every op the database lacks for this device, committing each at once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.optime.collect import OpInstance, distinct_ops
from echo_tune.cost.optime.optime_db import Measurement, OpTimeDB
from echo_tune.cost.optime.optime_device import DeviceInfo
from echo_tune.optime.insitu import measure_in_situ
from echo_tune.optime.measure import measure_key

OUT_OF_MEMORY = (MemoryError, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError))

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
    timed_alone: int = 0
    """Of the measured, those the in-place run did not show, timed alone from their keys (``measure.py``):
    e.g. a sliding-window layer's attention (the in-place run builds one dense and one MoE layer, full attention)."""
    host_overhead_s: float | None = None
    """Framework host time per op on a CPU (``optime/insitu.py``); None on CUDA or when nothing was run."""
    not_run: tuple[str, ...] = ()
    """Ops the in-place run did not show and that could not run alone from their traced keys on this device
    (e.g. a bf16 LayerNorm backward whose traced fp32 statistics the CPU kernel refuses): not in the database,
    so the efficiency surface prices them (``simulate`` states the share of compute measured)."""

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _shape(parallel: ParallelConfig) -> tuple:
    """What the traced pieces' shapes depend on (EP and ETP: the MoE layer's)."""
    return (parallel.tensor_model_parallel_size, parallel.context_parallel_size, parallel.sequence_parallel,
            parallel.micro_batch_size, parallel.precision, parallel.expert_model_parallel_size,
            parallel.expert_tensor_size)


def profile_layouts(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, layouts: list[ParallelConfig],
                    db: OpTimeDB, device: torch.device, info: DeviceInfo, *, progress: Progress | None = None,
                    **options) -> ProfileResult:
    """Measure the ops of ``layouts`` that ``db`` lacks, in place (``insitu.py``: one real micro-batch of
    each traced shape), an op the real run did not show, or every op of a shape whose pieces do not fit
    in memory, alone (``measure.py``); on a CPU also the host overhead per op. Rows are committed one by
    one: an interruption loses nothing measured."""
    known = db.known_keys(info)
    shapes = {_shape(p): p for p in layouts}
    needed = {s: distinct_ops(model, cluster, num_gpus, [p]) for s, p in shapes.items()}
    every = {op.key for ops in needed.values() for op in ops}
    todo_total = len(every - known)
    done, total_s, overheads, alone, not_run = 0, 0.0, [], 0, []
    flush_denormal = torch.set_flush_denormal(True)  # as emulate runs (GPUs do not slow down on them)
    try:
        for shape, parallel in shapes.items():
            todo = [op for op in needed[shape] if op.key not in known]
            if not todo:
                continue
            try:
                in_situ = measure_in_situ(model, cluster, num_gpus, parallel, device)
                overheads.append((in_situ.host_overhead_s, in_situ.ops))
                times = in_situ.times
            except OUT_OF_MEMORY:  # the shape's pieces do not fit: every op is timed alone
                times = {}
            for op in todo:
                measurement = times.get(op.key)
                if measurement is None:
                    try:
                        measurement, alone = measure_key(op.key, device, **options), alone + 1
                    except (RuntimeError, TypeError, ValueError) as exc:  # the kernel refuses the traced inputs
                        not_run.append(f"{op.name} ({str(exc).splitlines()[0][:80]})")
                        continue
                db.add(info, op.key, measurement)
                known.add(op.key)
                done, total_s = done + 1, total_s + measurement.time_s
                if progress is not None:
                    progress(done, todo_total, op, measurement)
        overhead = None
        if device.type == "cpu" and overheads:  # on CUDA the host runs ahead of the GPU: nothing to add
            overhead = sum(s * n for s, n in overheads) / sum(n for _, n in overheads)
            db.set_host_overhead(info, overhead, sum(n for _, n in overheads))
    finally:
        if flush_denormal:
            torch.set_flush_denormal(False)
    return ProfileResult(device=info.name, total=len(every), already=len(every) - todo_total, measured=done,
                         measured_time_s=total_s, timed_alone=alone, host_overhead_s=overhead,
                         not_run=tuple(not_run))
