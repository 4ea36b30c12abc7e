"""Op times measured in place (as Echo profiles kernels from a real run), and the host time per op.

``measure_in_situ`` runs one micro-batch of a shape's pieces for real on the device (embedding, one
transformer layer, one MoE layer when the model has them, output layer and loss; forward and backward
through autograd, built by the tracer's own layer code) and times every op the tracer would record (``recording.recorder.describe``: same filter, same
keys) as it runs: CUDA events around each op, or the thread's CPU time on a one-thread CPU. An op
thus sees the cache and memory state of a real step: its inputs were just produced by other ops, its
outputs go to freshly allocated memory. The median over occurrences and repeats is kept. The MoE layer
runs as ``emulate`` runs it (``emulate/moe.py``: a balanced router's tokens, the dispatch / combine
collectives not run, their outputs filled once per shape), so its router, permutation and expert ops are
timed in place too; what the in-place run still does not show (the sliding-window layers, MTP's extra
pieces) is timed alone (``ProfileResult.timed_alone``).

The host overhead: on a CPU the host *is* the device, and the framework's time between the ops
(Python layer code, autograd, the custom ops' wrappers, freeing memory) is part of the step. The same
pieces are also timed plainly; the plain time minus the ops' in-place times, per op, is that overhead.
The simulator adds it to every measured op on a CPU device; on CUDA the host runs ahead of the GPU and
it is not added.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.optime.optime_db import Measurement
from echo_tune.emulate.build import RealShard, unit_norms
from echo_tune.emulate.moe import RealMoE
from echo_tune.sim.schedule.passes import trace_pieces
from echo_tune.workload import layers
from echo_tune.workload.recording import context
from echo_tune.workload.ends import heads
from echo_tune.workload.recording.recorder import describe

def _clock(device: torch.device):
    single = device.type == "cpu" and torch.get_num_threads() == 1
    return (time.thread_time, "thread-cpu-time") if single else (time.perf_counter, "wall-clock")


class OpTimer(TorchDispatchMode):
    """Times each op the tracer would record, keyed as the tracer keys it."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.cuda = device.type == "cuda"
        self.clock, method = _clock(device)
        self.method = "in-situ cuda-events" if self.cuda else f"in-situ {method}"
        self.samples: dict[str, list[float]] = defaultdict(list)
        self._pending: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = func(*args, **kwargs)
            end.record()
        else:
            begin = self.clock()
            out = func(*args, **kwargs)
            elapsed = self.clock() - begin
        op = describe(func, args, kwargs, out, phase="", region="")
        if op is not None:
            if self.cuda:
                self._pending.append((op.key, start, end))
            else:
                self.samples[op.key].append(elapsed)
        return out

    def finish(self) -> dict[str, list[float]]:
        if self._pending:
            torch.cuda.synchronize()
            for key, start, end in self._pending:
                self.samples[key].append(start.elapsed_time(end) / 1e3)
            self._pending.clear()
        return self.samples


def _pieces_step(model: ModelSpec, parallel: ParallelConfig, sequence_parallel: bool, device: torch.device):
    """A function that runs one micro-batch of embedding, one layer (and one MoE layer) and the output layer,
    fwd + bwd."""
    shard = RealShard(model, parallel.tensor_model_parallel_size, parallel.context_parallel_size,
                      sequence_parallel, parallel.micro_batch_size, parallel.precision, device=str(device))
    layer, emb, out = layers.layer_params(shard), heads.embedding_params(shard), heads.output_params(shard)
    stack = [(layer, shard)]
    if model.is_moe:
        moe_shard = dataclasses.replace(shard, ep=parallel.expert_model_parallel_size,
                                        etp=parallel.expert_tensor_size, moe=True)
        stack.append((layers.layer_params(moe_shard), moe_shard))
    for params in [out] + [p for p, _ in stack]:
        unit_norms(params)
    real_moe = RealMoE() if model.is_moe else None
    s, b = shard.seq, shard.micro_batch_size
    ids, labels = shard.tensor(b, s, dtype=torch.int64), shard.tensor(s, b, dtype=torch.int64)
    positions = torch.arange(shard.seq_in, device=device)
    mask = torch.ones(s, b, dtype=torch.float32, device=device)
    params = [t for group in [emb, out] + [p for p, _ in stack] for t in layers.parameters(group)]

    def step() -> None:
        with context.activate(real_moe) if real_moe is not None else contextlib.nullcontext():
            h = heads.embedding_forward(ids, positions, emb, shard)
            for layer_params, layer_shard in stack:
                h = layers.layer_forward(h, layer_params, layer_shard)
            heads.output_forward(h, labels, mask, out, shard)[1].backward()
        for t in params:
            t.grad = None

    return step


@dataclass(frozen=True, kw_only=True)
class InSitu:
    times: dict[str, Measurement]
    """Median in-place time of every op of the shape's pieces, by key."""
    host_overhead_s: float
    """(plain step - sum of its ops' in-place times) / ops: the framework's time between ops."""
    ops: int
    """Ops the tracer records for one micro-batch of the pieces."""


def measure_in_situ(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, parallel: ParallelConfig,
                    device: torch.device, *, warmup: int = 2, repeats: int = 9) -> InSitu:
    """Time the shape's pieces plainly, then op by op (``OpTimer``)."""
    layout = check_compatible(model, cluster, num_gpus, parallel)
    step = _pieces_step(model, parallel, layout.sequence_parallel, device)
    clock, _ = _clock(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        step()
    plain, timer = [], OpTimer(device)
    for _ in range(repeats):  # alternated, so that both see the same load on a shared machine
        sync()
        begin = clock()
        step()
        sync()
        plain.append(clock() - begin)
        with timer:
            step()
    times = {}
    for key, samples in timer.finish().items():
        samples = sorted(samples)
        median = statistics.median(samples)
        p10, p90 = samples[int(0.1 * (len(samples) - 1))], samples[int(round(0.9 * (len(samples) - 1)))]
        times[key] = Measurement(time_s=median, spread=(p90 - p10) / median if median > 0 else 0.0,
                                 repeats=len(samples), warmup=warmup, method=timer.method)
    ran = ("layer", "moe_layer", "embedding", "output")  # the pieces ``step`` runs (not the window ones)
    ops = [op for name, trace in trace_pieces(model, parallel, layout).items() if name in ran
           for op in trace.forward + trace.backward if op.kind != "collective"]
    kernels = sum(times[op.key].time_s for op in ops if op.key in times)
    return InSitu(times=times, host_overhead_s=max(0.0, statistics.median(plain) - kernels) / len(ops), ops=len(ops))
