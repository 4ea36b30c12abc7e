"""Collective and interference microbenchmarks through ``torch.distributed``.

Groups are measured the way training uses them: every rank is in one group of each kind and all
groups of a kind run at once (all TP-like groups inside the nodes together, all DP-like groups
across nodes together). A point's time is the slowest rank's. send_recv is a ring exchange in the
group (each rank sends to the next and receives from the previous), as nccl-tests' sendrecv_perf;
broadcast is from the group's first rank, all_to_all exchanges equal slices with every member.

Sizes follow nccl-tests' "size" convention (all_gather: the gathered output; reduce_scatter: the
full input; all_to_all: one rank's whole send buffer; send_recv and broadcast: the message) so raw
results and nccl-tests logs fit the same model. The set is the one the simulator uses and
``calibrate fit`` reads from nccl-tests logs.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from echo_tune.calibrate.bench.bench_compute import DTYPES, Timer
from echo_tune.cost.collectives.comm import bus_factor

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    """This rank's group of one kind, and where that kind of group sits."""

    scope: str
    """"intra_node" (all members on one node) or "inter_node"."""
    ranks: tuple[int, ...]
    group: object
    num_nodes: int
    ranks_per_node: int

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True, kw_only=True)
class CommPlan:
    sizes_bytes: tuple[int, ...]
    interference_sizes_bytes: tuple[int, ...]
    interference_gemms: tuple[tuple[int, int, int], ...]
    gemm_dtype: str
    min_time_s: float
    max_iters: int = 200


def agree_max(value: float, device: torch.device) -> float:
    """The largest ``value`` over all ranks."""
    tensor = torch.tensor([float(value)], device=device, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def _buffers(collective: str, size_bytes: int, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    elements = max(n, size_bytes // 4 // n * n)
    if collective == "all_gather":
        return torch.ones(elements // n, device=device), torch.empty(elements, device=device)
    if collective == "reduce_scatter":
        return torch.ones(elements, device=device), torch.empty(elements // n, device=device)
    return torch.ones(elements, device=device), torch.empty(elements, device=device)


def collective_fn(collective: str, spec: GroupSpec, size_bytes: int, device: torch.device,
                  group: object | None = None) -> tuple[Callable[[], object], int]:
    """A callable running one collective over this rank's group, and the size in nccl-tests' convention."""
    group = group or spec.group
    src, dst = _buffers(collective, size_bytes, spec.size, device)
    if collective == "all_reduce":
        return (lambda: dist.all_reduce(src, group=group)), src.numel() * 4
    if collective == "all_gather":
        return (lambda: _ALL_GATHER(dst, src, group=group)), dst.numel() * 4
    if collective == "reduce_scatter":
        return (lambda: _REDUCE_SCATTER(dst, src, group=group)), src.numel() * 4
    if collective == "all_to_all":
        return (lambda: dist.all_to_all_single(dst, src, group=group)), src.numel() * 4
    if collective == "broadcast":
        return (lambda: dist.broadcast(src, src=spec.ranks[0], group=group)), src.numel() * 4
    me = dist.get_rank()
    peer = spec.ranks[(spec.ranks.index(me) + 1) % spec.size]
    back = spec.ranks[(spec.ranks.index(me) - 1) % spec.size]

    def send_recv():
        ops = [dist.P2POp(dist.isend, src, peer, group), dist.P2POp(dist.irecv, dst, back, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    return send_recv, src.numel() * 4


def time_collective_s(fn: Callable[[], object], timer: Timer, device: torch.device, plan: CommPlan,
                      repeats: int = 3) -> tuple[float, int]:
    """Seconds per call (the slowest rank's, best of ``repeats`` runs) and the iteration count all ranks agreed on."""
    local = timer.iters_for(fn, plan.min_time_s, plan.max_iters)
    iters = int(agree_max(local, device))
    best = float("inf")
    for _ in range(repeats):
        timer.sync()
        dist.barrier()
        best = min(best, agree_max(timer.run_s(fn, iters) / iters, device))
    return best, iters


def collective_rows(specs: list[GroupSpec], plan: CommPlan, timer: Timer, device: torch.device) -> list[dict]:
    rows = []
    for spec in specs:
        for collective in COLLECTIVES:
            for size in plan.sizes_bytes:
                fn, size_bytes = collective_fn(collective, spec, size, device)
                seconds, iters = time_collective_s(fn, timer, device, plan)
                algbw = size_bytes / seconds / 1e9
                rows.append({"collective": collective, "scope": spec.scope, "group_size": spec.size,
                             "num_nodes": spec.num_nodes, "ranks_per_node": spec.ranks_per_node, "dtype": "fp32",
                             "size_bytes": size_bytes, "time_us": seconds * 1e6, "algbw_gbyte_s": algbw,
                             "busbw_gbyte_s": algbw * bus_factor(collective, spec.size), "iters": iters})
    return rows


def _overlap_cuda(comm: Callable, gemm: Callable, counts: tuple[int, int]) -> tuple[float, float]:
    """Total seconds of the collectives (side stream) and of the GEMMs (current stream) run together."""
    stream = torch.cuda.Stream()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    torch.cuda.synchronize()
    stream.record_event(events[0])
    events[2].record()
    for i in range(max(counts)):
        if i < counts[0]:
            with torch.cuda.stream(stream):
                comm()
        if i < counts[1]:
            gemm()
    stream.record_event(events[1])
    events[3].record()
    torch.cuda.synchronize()
    return events[0].elapsed_time(events[1]) / 1e3, events[2].elapsed_time(events[3]) / 1e3


def _overlap_cpu(comm: Callable, gemm: Callable, counts: tuple[int, int], timer: Timer) -> tuple[float, float]:
    """Collectives in a thread (their own process group), GEMMs in the main thread, wall clock each."""
    comm_s = [0.0]

    def run_comm():
        comm_s[0] = timer.run_s(comm, counts[0])

    thread = threading.Thread(target=run_comm, daemon=True)
    thread.start()
    gemm_s = timer.run_s(gemm, counts[1])
    thread.join()
    return comm_s[0], gemm_s


def interference_rows(spec: GroupSpec, side_group: object, plan: CommPlan, timer: Timer,
                      device: torch.device) -> list[dict]:
    """GEMM alone vs beside an all-reduce, and the all-reduce alone vs beside the GEMM, over sizes."""
    rows = []
    for m, n, k in plan.interference_gemms:
        a = torch.randn(m, k, device=device, dtype=DTYPES[plan.gemm_dtype])
        b = torch.randn(k, n, device=device, dtype=DTYPES[plan.gemm_dtype])
        gemm = lambda: torch.mm(a, b)  # noqa: E731
        gemm_alone = agree_max(timer.time_s(gemm, plan.min_time_s, plan.max_iters), device)
        for size in plan.interference_sizes_bytes:
            comm, size_bytes = collective_fn("all_reduce", spec, size, device,
                                             group=side_group if not timer.cuda else None)
            comm_alone, _ = time_collective_s(comm, timer, device, plan)
            span = max(plan.min_time_s, 3 * max(comm_alone, gemm_alone))
            counts = (int(agree_max(math.ceil(span / comm_alone), device)),
                      int(agree_max(math.ceil(span / gemm_alone), device)))
            timer.sync()
            dist.barrier()
            comm_s, gemm_s = (_overlap_cuda(comm, gemm, counts) if timer.cuda
                              else _overlap_cpu(comm, gemm, counts, timer))
            comm_with = agree_max(comm_s / counts[0], device)
            gemm_with = agree_max(gemm_s / counts[1], device)
            rows.append({"gemm_m": m, "gemm_n": n, "gemm_k": k, "dtype": plan.gemm_dtype, "collective": "all_reduce",
                         "comm_scope": spec.scope, "group_size": spec.size, "num_nodes": spec.num_nodes,
                         "ranks_per_node": spec.ranks_per_node, "size_bytes": size_bytes,
                         "gemm_alone_us": gemm_alone * 1e6, "gemm_with_comm_us": gemm_with * 1e6,
                         "comm_alone_us": comm_alone * 1e6, "comm_with_gemm_us": comm_with * 1e6,
                         "compute_slowdown": gemm_with / gemm_alone, "comm_slowdown": comm_with / comm_alone})
    return rows
