"""Tensor-parallel communication overlap as Megatron-LM / Transformer Engine run it (``--tp-comm-overlap``).

With sequence parallelism each TE linear layer has one TP collective next to its GEMM. Megatron
hands them to TE's userbuffers (``initialize_ub`` in transformer_engine/pytorch/module/base.py, called
from megatron/training/initialize.py at d98e8a64ddf3), which pairs each collective with one GEMM by
one of three methods (TE's defaults):

- **ring exchange** (``qkv_fprop``, ``fc1_fprop``, ``proj_dgrad``, ``fc2_dgrad``: the all-gather of the
  GEMM's input): the GEMM is split into TP chunks of m/TP rows; chunk i runs on the rows already here
  while the next chunk arrives by peer-to-peer copy (copy engines, ~1 SM). The first chunk is local, so
  TP-1 chunks of GEMM hide the transfer; smaller chunks run at lower GEMM efficiency.
- **pipeline** (``proj_fprop``, ``fc2_fprop``: the reduce-scatter of the GEMM's output): the GEMM runs in
  ``num_splits`` = 4 chunks and each chunk's reduce-scatter runs beside the next chunk on ``num_sm``
  = 16 SMs taken from the GEMM (``set_sm_margin``); the last chunk's reduce-scatter is exposed.
- **bulk** (``qkv_dgrad``/``fc1_dgrad``: the all-gather of the saved input for wgrad beside the dgrad
  GEMM; ``qkv_wgrad``/``fc1_wgrad``: the reduce-scatter of dgrad's output beside the wgrad GEMM): the
  whole collective runs on ``num_sm`` = 16 SMs beside the whole GEMM.

So overlap is partial, and the GEMMs beside it lose the SMs given to communication. On top of the SM
share, a kernel beside a collective also competes for HBM and L2 (Echo, arXiv 2412.12487): the
profile's fitted slowdown curve (by message size; by kernel kind where the profile has one) or its
scalar ``compute_slowdown``, applied per overlapped op. NeMo's tuned per-model configs change
``num_sm`` (2-24) and ``num_splits``; echo-tune uses TE's defaults unless ``--tp-comm-overlap-cfg`` gives others
(config/launch/ub_config.py, ``pair_settings``): the SMs and splits, ``set_sm_margin`` off (the pipelined GEMM keeps all its
SMs, slowed only while a chunk's reduce-scatter runs beside it), ``aggregate`` (ring exchange: GEMM chunks of two
received blocks), and a reduce-scatter GEMM by ring exchange instead of the pipeline.
"""

from __future__ import annotations

from echo_tune.cost.profile import ClusterProfile
from echo_tune.workload.graph import Op

UB_NUM_SM = 16
"""SMs a pipeline or bulk userbuffer collective runs on (TE ``initialize_ub`` default ``num_sm``)."""
UB_NUM_SPLITS = 4
"""GEMM chunks of the pipelined reduce-scatter (TE default ``num_splits``)."""
DEFAULT_SM_COUNT = 132
"""SMs of an H100 SXM, used when a GPU preset does not give ``sm_count``."""


def slowdown(profile: ClusterProfile, which: str, size_bytes: float, kind: str = "gemm") -> float:
    """Slowdown of a ``which`` ("compute" or "comm") kernel beside a collective of ``size_bytes``:
    the profile's fitted curve 1 + A * size / (size + half) (a per-kind curve ``compute_<kind>`` first),
    else its scalar."""
    curves = profile.slowdown_curves or {}
    curve = curves.get(f"{which}_{kind}") or curves.get(which)
    if curve and "amplitude" in curve:
        return 1.0 + curve["amplitude"] * size_bytes / (size_bytes + curve["half_size_bytes"])
    if curve and "median" in curve:
        return max(1.0, curve["median"])
    return profile.compute_slowdown if which == "compute" else profile.comm_slowdown


def _saturation(x: float, profile: ClusterProfile) -> float:
    return x / (x + profile.gemm_half_saturation_dim)


def pair_methods(ops: tuple[Op, ...]) -> list[tuple[int, int, str]]:
    """(collective index, GEMM index, method) for each TP collective of one phase of a layer."""
    gemms = [i for i, op in enumerate(ops) if op.kind == "gemm"]
    pairs = []
    for i, op in enumerate(ops):
        if op.kind != "collective" or op.group != "tp":
            continue
        after = [g for g in gemms if g > i]
        before = [g for g in gemms if g < i]
        if op.phase == "fwd":
            if op.collective == "all_gather" and after:
                pairs.append((i, after[0], "ring_exchange"))
            elif before:
                pairs.append((i, before[-1], "pipeline"))
            continue
        if not after:
            continue
        # backward: a column-parallel layer gathers its input and reduce-scatters dgrad's output
        # (bulk, beside dgrad then wgrad); a row-parallel layer gathers dY for both GEMMs (ring exchange)
        following = [j for j in range(after[0] + 1, after[1] if len(after) > 1 else len(ops))]
        column = op.collective == "reduce_scatter" or any(ops[j].collective == "reduce_scatter" for j in following)
        pairs.append((i, after[0], "bulk" if column else "ring_exchange"))
    return pairs


def pair_settings(ops: tuple[Op, ...], settings: dict | None) -> list[tuple[int, int, object]]:
    """``pair_methods`` with each pair's TE userbuffer name and setting (config/launch/ub_config.py ``ub_settings``), or
    its method alone (TE's defaults) when ``settings`` is None. The name: the region's GEMM (qkv, proj, fc1 for the
    MLP's gather, fc2 for its reduce-scatter / its dY gather) and the pass (fprop; dgrad for a backward gather,
    wgrad for a backward reduce-scatter)."""
    pairs = pair_methods(ops)
    if settings is None:
        return pairs
    out = []
    for c, g, method in pairs:
        op = ops[c]
        gather = op.collective == "all_gather"
        gemm = {"qkv": "qkv", "attention_proj": "proj"}.get(op.region)
        if gemm is None:  # the dense MLP: fc1 gathers its input, fc2 reduce-scatters forward and gathers dY back
            gemm = "fc1" if (gather and op.phase == "fwd") or method == "bulk" else "fc2"
        step = "fprop" if op.phase == "fwd" else ("dgrad" if gather else "wgrad")
        out.append((c, g, settings[f"{gemm}_{step}"]))
    return out


def overlapped_cost(method: str, comm_s: float, gemm_s: float, gemm_op: Op, size_bytes: float, tp: int,
                    profile: ClusterProfile, sm_count: int, *, num_sm: int = UB_NUM_SM,
                    num_splits: int = UB_NUM_SPLITS, set_sm_margin: bool = True,
                    aggregate: bool = False) -> tuple[float, float]:
    """(exposed communication, extra GEMM time) of one collective overlapped with one GEMM (TE's defaults unless
    the keywords, a ``--tp-comm-overlap-cfg`` entry, say otherwise)."""
    comm_s *= slowdown(profile, "comm", size_bytes)
    contention = slowdown(profile, "compute", size_bytes) - 1.0
    m = (gemm_op.gemm_mnk or (4096, 0, 0))[0]
    if method == "ring_exchange":
        chunk = min(m, (2 if aggregate else 1) * m / tp)  # aggregate: two received blocks per GEMM chunk
        chunked = gemm_s * (_saturation(m, profile) / _saturation(max(chunk, 1.0), profile) - 1.0)
        hiding_s = (gemm_s + chunked) * (tp - 1) / tp
        exposed = max(0.0, comm_s - hiding_s)
        return exposed, chunked + min(comm_s, hiding_s) * contention
    share = num_sm / sm_count
    if method == "pipeline":
        chunked = gemm_s * (_saturation(m, profile) / _saturation(max(m / num_splits, 1.0), profile) - 1.0)
        tail = comm_s / num_splits
        if set_sm_margin:  # the GEMM chunks leave the communication's SMs free throughout
            slow_gemm = (gemm_s + chunked) / (1.0 - share)
        else:  # all SMs, shared only while a chunk's reduce-scatter runs beside it
            slow_gemm = gemm_s + chunked + min(comm_s - tail, gemm_s + chunked) * share / (1.0 - share)
        exposed = tail + max(0.0, comm_s - tail - slow_gemm * (num_splits - 1) / num_splits)
        return exposed, slow_gemm - gemm_s + min(comm_s - tail, slow_gemm) * contention
    # bulk: the comm kernel holds its SMs while it runs beside the GEMM (no SM margin set)
    overlap = min(comm_s, gemm_s)
    extra = overlap * (share / (1.0 - share) + contention)
    return max(0.0, comm_s - gemm_s - extra), extra


def async_pairs(ops: tuple[Op, ...]) -> list[tuple[int, int]]:
    """(collective index, GEMM index) of the backward TP collectives Megatron runs asynchronously beside a GEMM
    without userbuffers: a column-parallel layer's (Megatron-LM d98e8a64ddf3 core/tensor_parallel/layers.py
    ``LinearWithGradAccumulationAndAsyncCommunication.backward``; TE's Linear / LayerNormLinear backward the
    same, ``async_op=True``) reduction of its dgrad (all-reduce, or reduce-scatter with sequence parallelism)
    beside its wgrad GEMM, and with sequence parallelism the all-gather of its saved input beside its dgrad
    GEMM. A row-parallel layer's all-gather of dY feeds both of its GEMMs: it stays on the critical path. The
    GEMM is the layer's own (same region and sub-region): a collective outside a linear layer (MLA's RoPE-key
    gather, a blocking ``gather_from_sequence_parallel_region``) pairs with none."""
    pairs, n = [], len(ops)
    for i, op in enumerate(ops):
        if op.kind != "collective" or op.group != "tp" or op.phase == "fwd":
            continue
        gemm = next((j for j in range(i + 1, n) if ops[j].kind == "gemm" and ops[j].region == op.region
                     and ops[j].subregion == op.subregion), None)
        if gemm is None:
            continue
        if op.collective in ("all_reduce", "reduce_scatter"):
            pairs.append((i, gemm))
        elif op.collective == "all_gather":  # the input's re-gather: the layer's dgrad reduce-scatter follows
            following = next((j for j in range(i + 1, n) if ops[j].kind == "collective"), None)
            if following is not None and ops[following].collective == "reduce_scatter" \
                    and ops[following].region == op.region:
                pairs.append((i, gemm))
    return pairs


def async_cost(comm_s: float, gemm_s: float, size_bytes: float, profile: ClusterProfile) -> tuple[float, float]:
    """(exposed communication, extra GEMM time) of an NCCL collective run beside one GEMM on another stream: the
    part of the (slowed) collective the GEMM does not cover is exposed; the GEMM beside it is slowed by the
    profile's interference curve, as a DP bucket beside the backward is (sim/data_parallel/dp.py)."""
    comm_s *= slowdown(profile, "comm", size_bytes)
    overlap = min(comm_s, gemm_s)
    return comm_s - overlap, overlap * (slowdown(profile, "compute", size_bytes) - 1.0)
