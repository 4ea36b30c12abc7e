"""Turn traced pieces into timed pieces: compute, exposed TP/CP communication, interference.

Inside a layer, Megatron's TP (and SP) collectives sit on the critical path: the next GEMM needs
their result, except a column-parallel layer's backward ones, which NCCL runs beside one GEMM of the
layer (``cost/tp_overlap.async_pairs``). With ``tp_comm_overlap`` each is paired with one GEMM of its linear layer as TE's
userbuffers pair them (ring exchange, pipelined or bulk; ``cost/collectives/tp_overlap.py``): partly hidden, and
the GEMM slowed by the SMs given to communication and by memory contention. CP ring-attention
exchanges run beside the attention kernel. Where communication overlaps compute, the compute is
slowed by the profile's ``compute_slowdown`` (Echo's third idea) and the communication by
``comm_slowdown``.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.specs.cluster import GPUSpec
from echo_tune.config.specs.layout import GroupPlacement
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.kernels.compute import graph_replay_saving_s, is_measured, op_time_s
from echo_tune.cost.kernels.moe_grouped_gemm import is_grouped_expert_gemm, per_expert_op
from echo_tune.cost.collectives.moe_dispatch import MoEKernels
from echo_tune.cost.kernels.moe_fusion import fuse_memory_runs
from echo_tune.cost.host.host_bound import (DTOH_OP, HOST_LAUNCH_S, HOST_READ_OP, HOST_SYNC_OP, HOST_TORCH_CALL_S,
                                            SINGLE_CALL_SUBREGIONS, host_wait_s)
from echo_tune.cost.kernels.fp8 import (TP_OVERLAP_REGIONS, fp8_collective_bytes, fp8_gemm_time_s, group_cast,
                                        is_fp8_gemm)
from echo_tune.config.launch.ub_config import ub_settings
from echo_tune.cost.collectives.tp_overlap import (DEFAULT_SM_COUNT, async_cost, async_pairs, overlapped_cost, pair_settings,
                                       slowdown)
from echo_tune.cost.profile import ClusterProfile
from echo_tune.sim.features.cuda_graphs import captured_graphs, graph_of
from echo_tune.workload.graph import Op


@dataclass(frozen=True, kw_only=True)
class PhaseCost:
    """Time of one pass (forward or backward) of one piece for one micro-batch, by part."""

    compute_s: float = 0.0
    comm_exposed_s: float = 0.0
    interference_s: float = 0.0
    ep_comm_s: float = 0.0
    """MoE dispatch / combine (all-to-all or all-gather over the expert groups), never overlapped."""
    dp_comm_s: float = 0.0
    """Megatron-FSDP's per-unit parameter all-gathers / gradient reduce-scatters left exposed (sim/data_parallel/fsdp.py)."""
    offload_s: float = 0.0
    """Activation copies to / from host memory left exposed (``--cpu-offloading-num-layers``, sim/features/cpu_offload.py)."""

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_exposed_s + self.interference_s + self.ep_comm_s + self.dp_comm_s \
            + self.offload_s

    def __add__(self, other: "PhaseCost") -> "PhaseCost":
        return _built(self.compute_s + other.compute_s, self.comm_exposed_s + other.comm_exposed_s,
                      self.interference_s + other.interference_s, self.ep_comm_s + other.ep_comm_s,
                      self.dp_comm_s + other.dp_comm_s, self.offload_s + other.offload_s)

    def scaled(self, factor: float) -> "PhaseCost":
        return _built(self.compute_s * factor, self.comm_exposed_s * factor, self.interference_s * factor,
                      self.ep_comm_s * factor, self.dp_comm_s * factor, self.offload_s * factor)


def _built(compute_s: float, comm_exposed_s: float, interference_s: float, ep_comm_s: float, dp_comm_s: float,
           offload_s: float, _new=object.__new__) -> PhaseCost:
    """``PhaseCost(...)`` of these fields without the frozen dataclass's ``__init__`` (one ``object.__setattr__``
    per field: a third of the time of a sum or a scaling, which the simulator does ~50 times a layout). The same
    object: equal, same hash; tests/sim/test_costing_build.py checks it against the constructor."""
    cost = _new(PhaseCost)
    cost.__dict__.update(compute_s=compute_s, comm_exposed_s=comm_exposed_s, interference_s=interference_s,
                         ep_comm_s=ep_comm_s, dp_comm_s=dp_comm_s, offload_s=offload_s)
    return cost


ZERO = PhaseCost()
EXPERT_GROUPS = ("ep", "etp", "tpep")
CP_RING_GROUPS = ("cp", "cp_p2p")


def is_cp_ring(op: Op) -> bool:
    """A K/V exchange of ring attention (p2p, or a2a+p2p's ring level), which runs beside the attention kernels;
    the other CP collectives (all-gather / reduce-scatter of K/V, Ulysses all-to-alls) are on the critical path
    (workload/attention/cp_attention.py)."""
    return op.group in CP_RING_GROUPS and op.collective == "send_recv"


@dataclass(frozen=True, kw_only=True)
class CostContext:
    profile: ClusterProfile
    gpu: GPUSpec
    precision: str
    groups: dict[str, GroupPlacement]
    tp_comm_overlap: bool = False
    async_tp_backward: bool = True
    """A column-parallel layer's dgrad all-reduce runs beside its wgrad GEMM (``cost/tp_overlap.async_pairs``);
    False: ``--no-async-tensor-model-parallel-allreduce`` (Megatron-LM before 2021-09): it waits (``_runs_async``)."""
    fp8_recipe: str | None = None
    """The FP8 recipe when the linear GEMMs run in FP8 (cost/kernels/fp8.py); None = bf16 GEMMs."""
    moe: MoEKernels | None = None
    """The MoE kernels (flex dispatcher, fused router / permutation); None = NCCL all-to-all, unfused."""
    overlap_moe_expert_parallel_comm: bool = False
    """``--overlap-moe-expert-parallel-comm``: price the EP overlap of paired passes (``sim/features/moe_overlap.py``)."""
    delay_wgrad_compute: bool = False
    """``--delay-wgrad-compute`` (with the EP overlap)."""
    graph_capture: str = ""
    """What CUDA graphs capture (``sim/features/cuda_graphs.py capture_spec``); "" = nothing."""
    moe_dispatch_syncs: bool = True
    """The MoE dispatcher waits on the token counts once per forward (all but drop-and-pad; cost/host/host_bound.py)."""
    ub_config: tuple = ()
    """``--tp-comm-overlap-cfg``'s entries (config/launch/ub_config.py ``read_ub_config``); empty: TE's defaults."""
    host_bound: bool = True
    """Add the pass's wait on the host (cost/host/host_bound.py); False for the GPU-only parts of a pass the EP overlap
    pairs (sim/features/moe_overlap.py), whose whole passes carry the wait."""


def _overlapped(comm_s: float, hidden_by_s: float, profile: ClusterProfile, size_bytes: float = 0.0,
                kind: str = "attention") -> PhaseCost:
    """Communication of ``comm_s`` (messages of ``size_bytes`` each) run beside compute of ``hidden_by_s``
    (already counted as compute), slowed as the profile's curves say for that message size and kernel kind."""
    comm_s *= slowdown(profile, "comm", size_bytes, kind)
    overlap_s = min(comm_s, hidden_by_s)
    return PhaseCost(comm_exposed_s=comm_s - overlap_s,
                     interference_s=overlap_s * (slowdown(profile, "compute", size_bytes, kind) - 1.0))


def phase_cost(ops: tuple[Op, ...], ctx: CostContext, *, region: str | None = None, piece: str = "") -> PhaseCost:
    """Cost of a list of ops (optionally only those of one region) on one rank. ``piece``: the traced piece
    the ops belong to, for what CUDA graphs capture of it (a captured kernel runs closer behind the one before it,
    and the host issues one launch per graph instead of one per kernel; sim/features/cuda_graphs.py)."""
    return _phase(ops, ctx, region, piece)[0]


def host_issue_s(ops: tuple[Op, ...], ctx: CostContext, *, piece: str = "") -> float:
    """The host's time to issue ``ops`` as ``phase_cost`` counts it (``cost/host/host_bound.py``): the host time per
    kernel for each kernel issued from Python (an op; a GEMM per local expert; one launch per collective; one per
    CUDA graph replayed, none for its kernels), the C++ launch for each quantisation kernel of an FP8 GEMM."""
    return _phase(ops, ctx, None, piece)[1]


def phase_cost_and_host_s(ops: tuple[Op, ...], ctx: CostContext, *, piece: str = "") -> tuple[PhaseCost, float]:
    """``phase_cost`` and ``host_issue_s`` of ``ops`` from one pass over them."""
    return _phase(ops, ctx, None, piece)


def _runs_async(op: Op, ctx: CostContext) -> bool:
    """Whether a collective ``async_pairs`` found runs beside its GEMM under ``ctx``'s settings:
    - ``--no-async-tensor-model-parallel-allreduce`` (Megatron-LM 2021-09..2024-04 honoured it, for its own
      linears) waits for the dgrad all-reduce after both GEMMs; the sequence-parallel all-gather and
      reduce-scatter stayed asynchronous (layers.py asserts the flag off on that path);
    - ``--delay-wgrad-compute``: TE keeps the wgrad GEMM for later and waits for the dgrad reduction at the end of
      the backward, so only the input re-gather beside the dgrad GEMM overlaps (the output layer is Megatron's own
      ColumnParallelLinear, which keeps its wgrad in place);
    - ``--moe-shared-expert-overlap``: the shared expert's linears run without TP communication of their own
      (``parallel_mode=None``) and the block gathers / reduce-scatters around them, blocking."""
    if op.collective == "all_reduce" and not ctx.async_tp_backward:
        return False
    if ctx.delay_wgrad_compute and op.collective != "all_gather" and op.region != "output":
        return False
    return not (op.region == "moe" and op.subregion == "shared" and ctx.moe is not None
                and ctx.moe.shared_expert_overlap)


def _pads(ctx: CostContext) -> bool:
    """Whether the experts' padding copies run (workload/mlp/expert_padding.py): FP8 or FP4 linears, a dispatcher that
    leaves the padding to the experts, and dropless routing (drop-and-pad fills every expert to its capacity, aligned:
    ``moe_dispatch_syncs`` is False exactly then)."""
    return ctx.fp8_recipe is not None and ctx.moe is not None and ctx.moe.experts_pad and ctx.moe_dispatch_syncs


def _phase(ops: tuple[Op, ...], ctx: CostContext, region: str | None, piece: str) -> tuple[PhaseCost, float]:
    if region is not None:  # a region, or a tagged sub-region as "region/subregion" (e.g. "moe/expert_act")
        ops = tuple(op for op in ops if op.region == region or (op.subregion and f"{op.region}/{op.subregion}" == region))
    if ctx.moe is not None and ctx.moe.fused:
        ops = fuse_memory_runs(ops, ctx.moe.fused)
    fp8 = ctx.fp8_recipe is not None
    graphs = captured_graphs(ctx.graph_capture, piece) if ctx.graph_capture else ()
    replayed: set[int] = set()
    h = ctx.profile.host_time_per_kernel_s
    times, sizes, issued = [], [], []  # issued: (kernels the host issues, its time to issue them, their GPU time) per op
    sync_at = None  # index in ``issued`` where the host resumes after the MoE dispatcher's synchronisation
    syncs = []  # ... and after other host synchronisations (HOST_SYNC_OP)
    compute_s = attention_s = cast_s = 0.0
    cp_comm_s = cp_size = ep_comm_s = 0.0
    # a column-parallel layer's backward collectives run beside a GEMM on NCCL's stream (async_pairs); with
    # --tp-comm-overlap userbuffers take over the TE linears of a transformer layer (pair_methods)
    paired = {c: (g, "async") for c, g in async_pairs(ops) if _runs_async(ops[c], ctx)}
    if ctx.tp_comm_overlap:
        paired.update({c: (g, method) for c, g, method in pair_settings(ops, ub_settings(ctx.ub_config, ctx.groups["tp"].size) if ctx.ub_config else None)
                       if ops[c].region in TP_OVERLAP_REGIONS})  # method: TE's default, or a --tp-comm-overlap-cfg entry
    for op in ops:
        if op.kind == "collective":
            if sync_at is None and ctx.moe_dispatch_syncs and op.phase == "fwd" and op.region == "moe" \
                    and op.subregion == "dispatch":  # token counts to the host before the EP collective
                sync_at = len(issued)
            size = fp8_collective_bytes(op, ctx.fp8_recipe, ctx.precision) if fp8 else op.size_bytes
            if op.group == "ep" and op.collective == "all_to_all" and ctx.moe is not None and ctx.moe.flex:
                t = ctx.moe.all_to_all_s(op, size, ctx.groups["ep"])
            else:
                t = collective_time_s(op.collective, size, ctx.groups[op.group], ctx.profile)
            times.append(t)
            sizes.append(size)
            if is_cp_ring(op):
                cp_comm_s += t
                cp_size = max(cp_size, size)
            elif op.group in EXPERT_GROUPS:  # MoE dispatch / combine: on the critical path, not overlapped
                ep_comm_s += t
            # one NCCL launch; the GPU busy for its time where it sits on the compute stream's path (EP, and TP
            # unless overlapped with a GEMM), none where it runs beside compute (CP ring, TP overlap)
            serial = op.group in EXPERT_GROUPS or (not is_cp_ring(op) and not ctx.tp_comm_overlap)
            issued.append((1, h, t if serial else 0.0))
            continue
        if op.subregion == "expert_pad" and not _pads(ctx):  # the experts' FP8 padding copies run only under FP8 / FP4
            times.append(0.0)
            sizes.append(0)
            continue
        if op.name == DTOH_OP:  # on the dispatcher's device-to-host stream: a host call, no compute-stream time
            times.append(0.0)
            sizes.append(0)
            issued.append((1, h, 0.0))
            continue
        if op.name in (HOST_SYNC_OP, HOST_READ_OP):
            syncs.append(len(issued) + 1)  # the host resumes after the copy / the size it reads
        cast = 0.0
        # TE's GroupedLinear: one GEMM (and, under FP8, one quantisation) per local expert (moe_grouped_gemm.py)
        # (the TE op fuser's grouped MLP: one kernel over the group, its tiles scheduled together: moe_grouped_gemm.py)
        per_expert = not (ctx.moe is not None and ctx.moe.grouped_single_kernel)
        groups, one = (op.gemm_groups, per_expert_op(op)) \
            if is_grouped_expert_gemm(op) and per_expert and not is_measured(op, ctx.profile) else (1, op)
        if fp8 and is_fp8_gemm(op):
            t = groups * fp8_gemm_time_s(one, ctx.profile, ctx.gpu, ctx.fp8_recipe, ctx.precision)
            cast, casts = group_cast(one, groups, ctx.fp8_recipe, ctx.profile, ctx.gpu, ctx.precision)
            cast_s += cast
            kernels = groups + casts  # the GEMMs and their quantisation kernels, which TE's C++ launches
            host_s = groups * h + casts * HOST_LAUNCH_S if h > 0.0 else 0.0
        else:
            t = groups * op_time_s(one, ctx.profile, ctx.gpu, ctx.precision)
            single_call = h > 0.0 and (op.region, op.subregion) in SINGLE_CALL_SUBREGIONS
            kernels, host_s = groups, groups * (HOST_TORCH_CALL_S if single_call else h)
        g = -1 if graphs is None else (graph_of(op, graphs) if graphs else None)
        if g is not None:  # replayed from a CUDA graph: a shorter gap behind the kernel before, and the host
            t -= kernels * graph_replay_saving_s(one, ctx.profile)  # issues one launch per graph (none per step's)
            kernels = 0 if g in replayed or g == -1 else 1
            host_s = kernels * h
            replayed.add(g)
        issued.append((kernels, host_s, t + cast))
        times.append(t)
        sizes.append(0)
        compute_s += t
        if op.kind == "attention":
            attention_s += t
    exposed = extra = 0.0
    tp = ctx.groups["tp"].size
    sm_count = ctx.gpu.sm_count or DEFAULT_SM_COUNT
    for i, op in enumerate(ops):
        if op.kind != "collective" or is_cp_ring(op) or op.group in EXPERT_GROUPS:
            continue
        if i not in paired:
            exposed += times[i]
            continue
        g, method = paired[i]
        if method == "async":  # the compute stream waits for the part its GEMM did not cover
            e, x = async_cost(times[i], times[g], sizes[i], ctx.profile)
            issued[i] = (1, h, e)
        else:
            kw = {} if isinstance(method, str) else dict(num_sm=method.num_sm, num_splits=method.num_splits,
                                                         set_sm_margin=method.set_sm_margin, aggregate=method.aggregate)
            e, x = overlapped_cost(getattr(method, "method", method), times[i], times[g], ops[g], sizes[i], tp,
                                   ctx.profile, sm_count, **kw)
        exposed += e
        extra += x
    if ctx.host_bound:  # the GPU idle, waiting on the host
        compute_s += host_wait_s(issued, tuple(i for i in (sync_at, *syncs) if i is not None and i < len(issued)))
    cost = PhaseCost(compute_s=compute_s + cast_s, ep_comm_s=ep_comm_s) + \
        _overlapped(cp_comm_s, attention_s, ctx.profile, cp_size)
    return cost + PhaseCost(comm_exposed_s=exposed, interference_s=extra), sum(host for _, host, _ in issued)
