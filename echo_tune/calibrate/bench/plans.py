"""What ``echo-tune bench`` measures: shapes and sizes for CUDA and CPU, default and ``--quick``.

GPU shapes are those of Megatron GPT layers (hidden 4096-12288, TP 1-8, 4096 tokens per
micro-batch); CPU shapes are scaled down so the gloo path runs in seconds. Sizes span KB to GB on
GPU (KB to MB on CPU). Budgets: a default run stays under 5 minutes per node, --quick under 1.
"""

from __future__ import annotations

import torch

from echo_tune.calibrate.bench.bench_comm import CommPlan
from echo_tune.calibrate.bench.bench_compute import DTYPES, SweepPlan
from echo_tune.errors import CalibrationError

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def _geometric(low: int, high: int, factor: int) -> tuple[int, ...]:
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return tuple(sizes)


def compute_plan(device: torch.device, quick: bool, dtypes: tuple[str, ...] | None = None) -> SweepPlan:
    """The compute sweep for this device."""
    cuda = device.type == "cuda"
    dtypes = dtypes or (("bf16",) if cuda and quick else ("bf16", "fp16") if cuda else ("fp32",))
    bad = sorted(set(dtypes) - set(DTYPES))
    if bad:
        raise CalibrationError(f"unknown dtype(s) {bad} in --dtypes; choose from {sorted(DTYPES)}")
    if cuda:
        return SweepPlan(
            dtypes=dtypes, hidden_sizes=(4096, 8192) if quick else (4096, 8192, 12288),
            tp_degrees=(1, 8) if quick else (1, 2, 4, 8), tokens=4096,
            probe_dims=(256, 1024, 4096) if quick else (128, 256, 512, 1024, 2048, 4096, 8192),
            with_weight_grads=not quick, attention_seq_lens=(2048,) if quick else (1024, 2048, 4096, 8192),
            attention_heads=32, attention_head_dim=128,
            memory_sizes_bytes=(16 * MIB, 256 * MIB) if quick else _geometric(MIB, GIB, 4),
            min_time_s=0.005 if quick else 0.02)
    return SweepPlan(
        dtypes=dtypes, hidden_sizes=(256,) if quick else (256, 512), tp_degrees=(1, 2), tokens=128 if quick else 256,
        probe_dims=(32, 128, 256) if quick else (32, 64, 128, 256, 512), with_weight_grads=not quick,
        attention_seq_lens=(128,) if quick else (128, 256), attention_heads=4, attention_head_dim=64,
        memory_sizes_bytes=(256 * KIB, 4 * MIB, 16 * MIB) if quick else _geometric(64 * KIB, 64 * MIB, 4),
        min_time_s=0.002 if quick else 0.01, max_iters=50 if quick else 200)


def comm_plan(device: torch.device, quick: bool) -> CommPlan:
    """The collective and interference sweep for this device."""
    if device.type == "cuda":
        return CommPlan(
            sizes_bytes=_geometric(KIB, 256 * MIB, 8) if quick else _geometric(KIB, GIB, 4),
            interference_sizes_bytes=(16 * MIB, 128 * MIB) if quick else (MIB, 16 * MIB, 256 * MIB),
            interference_gemms=((8192, 8192, 8192),) if quick else ((8192, 8192, 8192), (4096, 4096, 4096)),
            gemm_dtype="bf16", min_time_s=0.005 if quick else 0.02)
    return CommPlan(
        sizes_bytes=_geometric(KIB, 4 * MIB, 4) if quick else _geometric(KIB, 16 * MIB, 4),
        interference_sizes_bytes=(256 * KIB, 2 * MIB) if quick else (64 * KIB, MIB, 4 * MIB),
        interference_gemms=((256, 256, 256),) if quick else ((256, 256, 256), (512, 512, 512)),
        gemm_dtype="fp32", min_time_s=0.002 if quick else 0.01, max_iters=50 if quick else 200)
