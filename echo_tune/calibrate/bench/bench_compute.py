"""Compute microbenchmarks: the GEMM sweep, fused attention and a memory-bound copy.

Each rank times its own device (every GPU of the node at once, as in training); results are
rows of plain dicts whose keys are the raw CSV columns (units in the names). On CUDA the timer
uses CUDA events on the current stream; on CPU the wall clock.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True, kw_only=True)
class SweepPlan:
    """What to run: shapes and sizes per kind of benchmark, and how long to time each point."""

    dtypes: tuple[str, ...]
    hidden_sizes: tuple[int, ...]
    tp_degrees: tuple[int, ...]
    tokens: int
    probe_dims: tuple[int, ...]
    with_weight_grads: bool
    attention_seq_lens: tuple[int, ...]
    attention_heads: int
    attention_head_dim: int
    memory_sizes_bytes: tuple[int, ...]
    min_time_s: float
    max_iters: int = 200


class Timer:
    """Times a callable: warm-up, one calibration run, then enough iterations to last ``min_time_s``."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def run_s(self, fn: Callable[[], object], iters: int) -> float:
        """Total seconds of ``iters`` back-to-back calls."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        begin = time.perf_counter()
        for _ in range(iters):
            fn()
        return time.perf_counter() - begin

    def iters_for(self, fn: Callable[[], object], min_time_s: float, max_iters: int, warmup: int = 2) -> int:
        for _ in range(warmup):
            fn()
        self.sync()
        once = max(self.run_s(fn, 1), 1e-7)
        return max(1, min(max_iters, math.ceil(min_time_s / once)))

    def time_s(self, fn: Callable[[], object], min_time_s: float, max_iters: int, repeats: int = 3) -> float:
        """Mean seconds per call, the best of ``repeats`` runs (the least disturbed one)."""
        iters = self.iters_for(fn, min_time_s, max_iters)
        return min(self.run_s(fn, iters) for _ in range(repeats)) / iters


def megatron_gemm_shapes(plan: SweepPlan) -> list[tuple[int, int, int]]:
    """(m, n, k) of the GEMMs of a Megatron GPT layer for each hidden size and TP degree, plus probes.

    Forward: QKV (T, 3h/t, h), attention projection (T, h, h/t), MLP fc1 (T, 4h/t, h), fc2 (T, h, 4h/t),
    with T tokens per micro-batch. Weight gradients swap the token dimension into k. Square and
    skinny probes cover the small dimensions the saturation g(x) = x / (x + x_half) needs.
    """
    shapes: list[tuple[int, int, int]] = []
    tokens = plan.tokens
    for h in plan.hidden_sizes:
        for t in plan.tp_degrees:
            if h % t:
                continue
            fwd = [(tokens, 3 * h // t, h), (tokens, h, h // t), (tokens, 4 * h // t, h), (tokens, h, 4 * h // t)]
            shapes += fwd
            if plan.with_weight_grads:
                shapes += [(n, k, m) for m, n, k in fwd]
    for d in plan.probe_dims:
        shapes += [(d, d, d), (d, max(plan.probe_dims), max(plan.probe_dims))]
    return list(dict.fromkeys(shapes))


def gemm_rows(plan: SweepPlan, device: torch.device, timer: Timer, rank: int) -> list[dict]:
    rows = []
    for dtype in plan.dtypes:
        for m, n, k in megatron_gemm_shapes(plan):
            a = torch.randn(m, k, device=device, dtype=DTYPES[dtype])
            b = torch.randn(k, n, device=device, dtype=DTYPES[dtype])
            seconds = timer.time_s(partial(torch.mm, a, b), plan.min_time_s, plan.max_iters)
            rows.append({"rank": rank, "device": device.type, "dtype": dtype, "m": m, "n": n, "k": k,
                         "time_us": seconds * 1e6, "tflops": 2.0 * m * n * k / seconds / 1e12})
            del a, b
    return rows


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool, phase: str) -> float:
    """FLOPs of fused attention: QK^T and PV (2 matmuls) forward, 5 matmuls backward; causal halves."""
    forward = 4.0 * batch * heads * seq_len * seq_len * head_dim * (0.5 if causal else 1.0)
    return forward if phase == "fwd" else 2.5 * forward


def attention_rows(plan: SweepPlan, device: torch.device, timer: Timer, rank: int) -> list[dict]:
    rows = []
    dtype = plan.dtypes[0]
    heads, dim = plan.attention_heads, plan.attention_head_dim
    for seq in plan.attention_seq_lens:
        q, k, v = (torch.randn(1, heads, seq, dim, device=device, dtype=DTYPES[dtype], requires_grad=True)
                   for _ in range(3))
        grad = torch.randn(1, heads, seq, dim, device=device, dtype=DTYPES[dtype])

        def forward():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def forward_backward():
            torch.autograd.grad(forward(), (q, k, v), grad)

        # backward = (forward + backward) - forward: on a noisy device the two timings can leave nothing (a
        # "1 ns" backward once reached calibrate fit as 20,971 TFLOP/s); time both again, a few times, until the
        # backward is at least a quarter of the forward (its FLOPs are 2.5x), else write no backward row
        for _ in range(3):
            fwd_s = timer.time_s(forward, plan.min_time_s, plan.max_iters)
            bwd_s = timer.time_s(forward_backward, plan.min_time_s, plan.max_iters) - fwd_s
            if bwd_s >= 0.25 * fwd_s:
                break
        phases = [("fwd", fwd_s)] + ([("bwd", bwd_s)] if bwd_s >= 0.25 * fwd_s else [])
        for phase, seconds in phases:
            flops = attention_flops(1, heads, seq, dim, True, phase)
            rows.append({"rank": rank, "device": device.type, "dtype": dtype, "batch": 1, "heads": heads,
                         "seq_len": seq, "head_dim": dim, "causal": True, "phase": phase, "time_us": seconds * 1e6,
                         "flops": flops, "tflops": flops / seconds / 1e12})
    return rows


def memory_rows(plan: SweepPlan, device: torch.device, timer: Timer, rank: int) -> list[dict]:
    """A device-to-device copy: reads and writes ``size_bytes`` each, so moves twice that."""
    rows = []
    for size in plan.memory_sizes_bytes:
        src = torch.empty(size // 4, device=device, dtype=torch.float32).uniform_()
        dst = torch.empty_like(src)
        seconds = timer.time_s(partial(dst.copy_, src), plan.min_time_s, plan.max_iters)
        moved = 2 * src.numel() * 4
        rows.append({"rank": rank, "device": device.type, "dtype": "fp32", "size_bytes": src.numel() * 4,
                     "bytes_moved": moved, "time_us": seconds * 1e6, "bandwidth_gbyte_s": moved / seconds / 1e9})
        del src, dst
    return rows
