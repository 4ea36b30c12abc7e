"""Time one op instance with real tensors on the local device.

The call is rebuilt from its key (``workload/recording/opkey.py``: random normal floats, zero indices and
masks, the traced strides). On CUDA each call is timed with CUDA events after a warm-up; on CPU with
the thread's CPU time when torch runs one intra-op thread (other processes on a shared machine do not
inflate it; ``emulate`` uses the same clock), else ``time.perf_counter``. The time kept is the median
call; ``spread`` is (p90 - p10) / median.
Calls repeat until ``min_total_s`` of timed work or ``max_repeats`` (at least ``min_repeats``); a cache
flush (``flush_bytes``) precedes each timed call.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torch

import echo_tune.workload.recording.kernels_real  # noqa: F401  (real echo_tune:: kernels)
from echo_tune.cost.optime.optime_db import Measurement
from echo_tune.errors import ConfigError
from echo_tune.workload.recording.opkey import key_summary, materialize, parse_key, resolve_op

CUDA_FLUSH_BYTES = 256 * 2**20
"""Written before every timed call on CUDA to clear the L2 cache, as Triton's ``do_bench`` does: an op
must not find its own inputs in L2 from the previous repeat (in a step they come from other ops)."""


def flush_bytes(device: torch.device) -> int:
    """Bytes to write before each timed call: CUDA_FLUSH_BYTES, or on CPU twice the core's L2 cache
    (from sysfs; 1 MiB assumed if unreadable), so inputs come from the shared L3 as in a step."""
    if device.type == "cuda":
        return CUDA_FLUSH_BYTES
    l2 = 2**20
    try:
        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            if (index / "level").read_text().strip() == "2":
                text = (index / "size").read_text().strip().upper()
                l2 = int(text.rstrip("KMB")) * {"K": 2**10, "M": 2**20}.get(text.rstrip("B")[-1], 1)
    except (OSError, ValueError):
        pass
    return 2 * l2
WARMUP = 3
MIN_REPEATS = 5
MAX_REPEATS = 30
MIN_TOTAL_S = 0.02


def _summary(times: list[float], warmup: int, method: str) -> Measurement:
    times = sorted(times)
    median = statistics.median(times)
    p10, p90 = times[int(0.1 * (len(times) - 1))], times[int(round(0.9 * (len(times) - 1)))]
    return Measurement(time_s=median, spread=(p90 - p10) / median if median > 0 else 0.0,
                       repeats=len(times), warmup=warmup, method=method)


def prepare(key: str, device: torch.device, seed: int = 0):
    """A zero-argument callable that runs the keyed op once on ``device``."""
    name, args, kwargs = parse_key(key)
    func = resolve_op(name)
    generator = torch.Generator(device=device).manual_seed(seed)
    real_args = materialize(args, device, generator)
    real_kwargs = materialize(kwargs, device, generator)
    return lambda: func(*real_args, **real_kwargs)


def time_call(call, device: torch.device, *, warmup: int = WARMUP, min_repeats: int = MIN_REPEATS,
              max_repeats: int = MAX_REPEATS, min_total_s: float = MIN_TOTAL_S) -> Measurement:
    """Median time of ``call()`` on ``device`` (caches flushed before each timed call)."""
    flush = torch.empty(flush_bytes(device) // 4, dtype=torch.float32, device=device)
    with torch.no_grad():
        for _ in range(warmup):
            call()
        times: list[float] = []
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            while len(times) < max_repeats and (len(times) < min_repeats or sum(times) < min_total_s):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                flush.zero_()
                start.record()
                call()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            return _summary(times, warmup, "cuda-events")
        single = torch.get_num_threads() == 1
        clock = time.thread_time if single else time.perf_counter
        while len(times) < max_repeats and (len(times) < min_repeats or sum(times) < min_total_s):
            flush.zero_()
            begin = clock()
            call()
            times.append(clock() - begin)
    return _summary(times, warmup, "thread-cpu-time" if single else "wall-clock")


def measure_key(key: str, device: torch.device, **options) -> Measurement:
    """Build the keyed op's inputs once and time it."""
    return time_call(prepare(key, device), device, **options)


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def memory_needed(key: str, device: torch.device) -> int:
    """Bytes timing the keyed op alone takes on ``device``: its inputs' storages (as ``prepare`` builds them, with
    the float32 draw a half-precision input is cast from), its outputs (the op run on ``meta``: no memory) and the
    cache-flush buffer."""
    name, args, kwargs = parse_key(key)
    meta = torch.device("meta")
    real_args, real_kwargs = materialize(args, meta), materialize(kwargs, meta)
    inputs = _tensors([real_args, real_kwargs])
    stored = sum(t.untyped_storage().nbytes() for t in inputs)
    draw = max((4 * t.untyped_storage().nbytes() // t.element_size() for t in inputs
                if t.dtype.is_floating_point and t.dtype != torch.float32), default=0)
    try:
        outputs = sum(t.numel() * t.element_size() for t in _tensors(resolve_op(name)(*real_args, **real_kwargs)))
    except (RuntimeError, TypeError, ValueError, NotImplementedError):  # no meta kernel: outputs as large as inputs
        outputs = stored
    return stored + draw + outputs + flush_bytes(device)


def available_memory(device: torch.device) -> int | None:
    """Bytes free for new tensors on ``device``: CUDA's free memory (``torch.cuda.mem_get_info``), or the host's
    available RAM (psutil when installed, else /proc/meminfo's MemAvailable, else the free pages); None if unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        import psutil  # optional: not a dependency
        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None



def check_fits(ops, device: torch.device) -> None:
    """Refuse in one line, before anything is allocated, when the largest of ``ops`` (``collect.OpInstance``) needs
    more memory than ``device`` has free: its real tensors would end in an allocator error (or the host's OOM
    killer) halfway through a run."""
    free = available_memory(device) if ops else None
    if free is None:
        return
    need, op = max(((memory_needed(op.key, device), op) for op in ops), key=lambda pair: pair[0])
    if need > free:
        name, shapes, dtypes = key_summary(op.key)
        shapes = shapes if len(shapes) <= 80 else shapes[:77] + "..."
        raise ConfigError(f"`op memory <= free memory` must hold for each op `profile` times, but got (op={name}, "
                          f"shapes={shapes} {dtypes}, op memory={need / 2**30:,.2f} GiB, free memory on "
                          f"{device.type}={free / 2**30:,.2f} GiB); profile a smaller shape: a smaller --seq-length "
                          f"or --micro-batch-size (or more --tensor-model-parallel-size / --context-parallel-size)")
