"""How much of a simulated step's compute time came from measured op times, and the device rule."""

from __future__ import annotations

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.specs.layout import Layout
from echo_tune.cost.kernels.compute import is_measured, op_time_s
from echo_tune.cost.kernels.fp8 import fp8_gemm_time_s, is_fp8_gemm
from echo_tune.cost.kernels.moe_grouped_gemm import is_grouped_expert_gemm, per_expert_op
from echo_tune.cost.profile import ClusterProfile
from echo_tune.errors import ConfigError
from echo_tune.cost.optime.optime_device import mismatch
from echo_tune.workload.graph import Op, Trace


def check_op_times_device(profile: ClusterProfile, cluster: ClusterSpec) -> None:
    """Refuse (one line) a profile whose op-time database was measured on another device than the cluster's."""
    times = profile.op_times
    why = None if times is None else mismatch(times.device, times.kind, cluster.gpu.name, cluster.gpu.memory_bytes)
    if why is not None:
        raise ConfigError(f"op-time database {times.path!r} was measured on {times.device!r}, not on the GPU "
                          f"{cluster.gpu.name!r} of cluster {cluster.name!r} ({why}); run `echo-tune profile` on that "
                          f"GPU or use a profile without `op_times`")


def _stage_ops(pieces: dict[str, Trace], layout: Layout, stage: int) -> list[tuple[Op, float]]:
    """(op, how many times the stage runs it per micro-batch), recompute included."""
    layers = sum(layout.stage_chunk_layers[stage])
    layer = pieces["layer"]
    weighted = [(op, layers) for op in layer.forward + layer.backward]
    if layout.recompute_granularity == "full":
        replayed = layers if layout.recompute_method != "block" else sum(
            min(n, layout.recompute_num_layers) for n in layout.stage_chunk_layers[stage])
        weighted += [(op, replayed) for op in layer.forward]
    elif layout.recompute_granularity == "selective":
        weighted += [(op, layers) for op in layer.forward if op.region == "core_attention"]
    for piece, at in (("embedding", layout.holder("embedding")[0]), ("output", layout.holder("loss")[0])):
        if stage == at:
            weighted += [(op, 1) for op in pieces[piece].forward + pieces[piece].backward]
    return [(op, n) for op, n in weighted if op.kind != "collective" and n > 0]


def measured_compute_share(pieces: dict[str, Trace], layout: Layout, stage: int, profile: ClusterProfile,
                           cluster: ClusterSpec, precision: str, fp8: bool | str | None = False) -> float | None:
    """Share of the stage's compute time whose ops were measured; None without an op-time database.

    With ``fp8`` (True, or the low-precision recipe's name), the linear GEMMs run in FP8 (or NVFP4) and are priced from the GPU's FP8 peak (``cost/kernels/fp8.py``), never
    from the database (which holds plain-precision times): they count as not measured."""
    if profile.op_times is None:
        return None
    total = measured = 0.0
    for op, n in _stage_ops(pieces, layout, stage):
        if fp8 and is_fp8_gemm(op):
            groups, one = (op.gemm_groups, per_expert_op(op)) if is_grouped_expert_gemm(op) else (1, op)
            total += n * groups * fp8_gemm_time_s(one, profile, cluster.gpu, fp8 if isinstance(fp8, str) else None,
                                                     precision)
            continue
        t = n * op_time_s(op, profile, cluster.gpu, precision)
        total += t
        if is_measured(op, profile):
            measured += t
    return measured / total if total > 0 else 0.0
