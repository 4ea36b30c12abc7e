"""Compute-op time: a GEMM efficiency surface, fused attention, memory-bound ops, launch overhead.

    gemm:      time = max(flops / (peak * e_max * g(m) g(n) g(k)), bytes / hbm) + launch
    attention: time = max(flops / (peak * attention_efficiency), exponentials / SFU rate, bytes / hbm) + launch
               (backward: ``attention_backward_efficiency``, when the profile sets it; a causal-masked
               forward at ``attention_causal_factor`` of that)
    memory:    time = bytes / hbm + launch

where ``peak`` is the datasheet tensor-core peak times the GPU's ``clock_factor`` (sustained over peak
SM clock under the power limit: compute-bound time scales with the clock, memory-bound time does not),
with the saturation g(x) = x / (x + x_half): small dimensions leave tensor cores idle (tile
quantisation and wave tails). e_max, x_half, the HBM bandwidth and the launch cost come from the
cluster's calibration profile. When the profile points at an op-time database (``echo-tune
profile``), an op measured there takes its measured time instead (a dict lookup by the op's key),
plus the database's host time per op (non-zero for CPU devices only; ``optime/insitu.py``).
"""

from __future__ import annotations

from echo_tune.config.specs.cluster import GPUSpec
from echo_tune.cost.kernels.gemm_saturation import size_saturation
from echo_tune.cost.profile import ClusterProfile
from echo_tune.workload.graph import Op


def gemm_efficiency(m: float, n: float, k: float, profile: ClusterProfile) -> float:
    """Fraction of dense peak a GEMM of shape (m, n, k) reaches."""
    return profile.gemm_max_efficiency * size_saturation(m, n, k, profile.gemm_half_saturation_dim)


def op_time_s(op: Op, profile: ClusterProfile, gpu: GPUSpec, precision: str) -> float:
    """Time of one compute op on an otherwise idle GPU (collectives are timed in comm.py)."""
    if profile.op_times is not None:
        measured = profile.op_times.times.get(op.key)
        if measured is not None:
            return measured + profile.op_times.host_overhead_s
    memory_s = op.bytes / (profile.memory_bandwidth_gbyte_s * 1e9)
    peak_flops = gpu.peak_tflops(precision) * 1e12 * gpu.clock_factor
    if op.kind == "gemm":
        m, n, k = op.gemm_mnk or (4096, 4096, 4096)
        compute_s = op.flops / (peak_flops * gemm_efficiency(m, n, k, profile))
    elif op.kind == "attention":
        efficiency = profile.attention_bwd_efficiency if op.phase == "bwd" else profile.attention_efficiency
        if op.causal and op.phase == "fwd":
            efficiency *= profile.attention_causal_factor
        compute_s = op.flops / (peak_flops * efficiency)
        exp_rate = gpu.ex2_per_s
        if op.exps and exp_rate:  # the softmax's exponentials on the SFUs, overlapped with the MMAs (FA3 / FA4)
            compute_s = max(compute_s, op.exps / exp_rate)
    else:
        compute_s = 0.0
    return max(compute_s, memory_s) + profile.kernel_launch_overhead_s


def is_measured(op: Op, profile: ClusterProfile) -> bool:
    """Whether ``op_time_s`` takes this op's time from the op-time database."""
    return profile.op_times is not None and op.key in profile.op_times.times


# A kernel replayed from a CUDA graph skips the CPU launch (the host's side: cost/host/host_bound.py) and starts closer
# behind the kernel before it, but keeps its own time on the GPU (ramp-up, the tail of its last wave): NVIDIA's
# "Getting Started with CUDA Graphs" (A. Gray, NVIDIA Technical Blog, 2019) timed a ~2.9 us kernel at 3.8 us per
# kernel launched back-to-back into a stream and 3.4 us per kernel replayed from a graph: 0.4 us saved per kernel.
GRAPH_REPLAY_SAVING_S = 0.4e-6


def graph_replay_saving_s(op: Op, profile: ClusterProfile) -> float:
    """What one kernel of ``op`` saves of ``op_time_s`` when it is replayed from a CUDA graph (sim/features/cuda_graphs.py):
    a measured op, the database's host time per op (it is the host's, which a graph does not run); else the gap
    between two kernels a graph shortens (``GRAPH_REPLAY_SAVING_S``), at most the profile's per-kernel overhead."""
    if is_measured(op, profile):
        return profile.op_times.host_overhead_s
    return min(GRAPH_REPLAY_SAVING_S, profile.kernel_launch_overhead_s)
