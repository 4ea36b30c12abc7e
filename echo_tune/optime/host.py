"""Host overhead per op: what an eager training step costs beyond its kernels, on a CPU device.

The same model code (one layer, the embedding, the output layer and loss; forward and backward) runs
on the ``meta`` device, where kernels do nothing, so its time is the framework's alone: Python layer
code, autograd, the dispatcher, the custom ops' wrappers. Divided by the number of traced ops it is a
per-op host cost. On a CPU the host *is* the device, so the simulator adds it to every measured op
(``OpTimes.host_overhead_s``); on CUDA the host runs ahead of the GPU and it is stored but not added.
"""

from __future__ import annotations

import statistics
import time

import torch

from echo_tune.config.cluster import ClusterSpec
from echo_tune.config.compatibility import check_compatible
from echo_tune.config.model import ModelSpec
from echo_tune.config.parallel import ParallelConfig
from echo_tune.sim.passes import trace_pieces
from echo_tune.workload import heads, layers


def host_time_s(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, parallel: ParallelConfig, *,
                repeats: int = 7) -> tuple[float, int]:
    """(median host time of one meta forward+backward of layer, embedding and output; traced ops in it)."""
    from echo_tune.emulate.build import RealShard

    layout = check_compatible(model, cluster, num_gpus, parallel)
    shard = RealShard(model, parallel.tensor_model_parallel_size, parallel.context_parallel_size,
                      layout.sequence_parallel, parallel.micro_batch_size, parallel.precision, device="meta")
    layer, emb, out = layers.layer_params(shard), heads.embedding_params(shard), heads.output_params(shard)
    s, b = shard.seq, shard.micro_batch_size
    ids, labels = shard.tensor(b, s, dtype=torch.int64), shard.tensor(s, b, dtype=torch.int64)
    positions, mask = shard.tensor(shard.seq_in, dtype=torch.int64), shard.tensor(s, b, dtype=torch.float32)
    single = torch.get_num_threads() == 1
    clock = time.thread_time if single else time.perf_counter
    times = []
    for i in range(repeats + 2):
        begin = clock()
        h = heads.embedding_forward(ids, positions, emb, shard)
        h = layers.layer_forward(h, layer, shard)
        loss = heads.output_forward(h, labels, mask, out, shard)[1]
        loss.backward()
        elapsed = clock() - begin
        for group in (layer, emb, out):
            for t in layers.parameters(group):
                t.grad = None
        if i >= 2:
            times.append(elapsed)
    pieces = trace_pieces(model, parallel, layout)
    ops = sum(op.kind != "collective" for trace in pieces.values() for op in trace.forward + trace.backward)
    return statistics.median(times), ops
