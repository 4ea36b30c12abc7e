"""The flex dispatcher's kernels (``--moe-token-dispatcher-type flex``): DeepEP and HybridEP dispatch / combine.

Megatron-Core's flex dispatcher (megatron/core/transformer/moe/token_dispatcher.py, fused_a2a.py,
NVIDIA/Megatron-LM commit d98e8a64ddf3) hands the tokens to DeepEP's "normal" kernels or to NVIDIA's
HybridEP. Unlike NCCL's all-to-all of the ``alltoall`` dispatcher, which sends each of a token's top-k copies
on its own, they **de-duplicate**: a token crosses the network once per destination *node* (then is forwarded
over NVLink to the ranks there) and is written once per destination *rank*, whatever the number of its
experts on that rank (DeepEP README: "aligned with the group-limited gating algorithm ... forwarding data from
NVLink domain to RDMA domain"; Megatron's README: "Removes redundant tokens during cross-node communication").
How many nodes / ranks a token's k copies reach is counted exactly for uniform routing, with DeepSeek's
group-limited routing (``--moe-router-num-groups`` / ``--moe-router-group-topk``) where set
(``expected_units_reached``).

Time of one dispatch (or combine) on one rank = the larger of its RDMA bytes over the network bandwidth and its
NVLink bytes over the NVLink bandwidth (the kernels forward both at once); bandwidths are the kernels' own
published ones, not NCCL's fitted tiers: the NVLink side per GPU generation, EP ranks and SMs
(``cost/collectives/flex_bandwidth.py``: Hopper, B200, GB200 NVL72), the RDMA side below. A "node" is the NVLink domain (72
GPUs of a GB200 NVL72 rack: an EP group inside one rack never touches the network). No per-call latency is added: the READMEs give the normal
kernels' throughput only. The kernels run on their own SMs (``FLEX_SMS``): compute running beside them (the EP
overlap, ``sim/features/moe_overlap.py``) loses those SMs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.cost.collectives.flex_bandwidth import nvlink_gbyte_s as measured_nvlink_gbyte_s
from echo_tune.cost.kernels.moe_fusion import fused_subregions
from echo_tune.errors import ConfigError

# DeepEP README (deepseek-ai/DeepEP, docs/legacy.md at dd758caf, "Normal kernels with NVLink and RDMA
# forwarding"): H800 (~160 GB/s NVLink), CX7 InfiniBand 400 Gb/s (~50 GB/s) per GPU, 4096 tokens, hidden 7168,
# top-4 groups, top-8 experts. Internode RDMA bottleneck bandwidth by EP size: 16: 43/43, 32: 58/57, 64: 51/50 GB/s
# (dispatch/combine). (Its intranode row is in data/flex-dispatch-nvlink.yaml with the Blackwell rows.)
DEEPEP_RDMA_GBYTE_S = {16: {"dispatch": 43.0, "combine": 43.0}, 32: {"dispatch": 58.0, "combine": 57.0},
                       64: {"dispatch": 51.0, "combine": 50.0}}
# HybridEP README (deepseek-ai/DeepEP branch hybrid-ep at 94a9f8f6, docs/README_Hybrid-EP.md, "H100 Platform"):
# 4096 tokens, hidden 7168, top-8, 8 local experts, algorithm bandwidth over IB, Torch API, 16 SMs:
# ranks 16: dispatch (BF16) 54.47, combine 53.35; 32: 47.36, 52.53; 64: 41.24, 46.57 GB/s. Taken as the RDMA
# bandwidth as DeepEP's (an assumption: the README calls it algorithm bandwidth). It gives no intranode H100
# number: HybridEP's NVLink side is taken as DeepEP's (assumption).
HYBRIDEP_RDMA_GBYTE_S = {16: {"dispatch": 54.47, "combine": 53.35}, 32: {"dispatch": 47.36, "combine": 52.53},
                         64: {"dispatch": 41.24, "combine": 46.57}}
MEASURED_NIC_GBYTE_S = 50.0
"""One CX7 400 Gb/s NIC per GPU, the network both READMEs measured on: the RDMA numbers scale with a cluster's
per-GPU NIC bandwidth relative to it."""
FLEX_SMS = {"deepep": 20, "hybridep": 16}
"""SMs the kernels occupy by default, which are also the SM counts the bandwidths above were measured with:
DeepEP's ``Buffer.num_sms`` default 20 (deep_ep/buffer.py at 1cf85fb2, the default Megatron keeps:
token_dispatcher.py at d98e8a64 ``set_deepep_num_sms``, "None -> 20"); HybridEP: the 16 SMs of the README row
used above. ``--moe-flex-dispatcher-num-sms`` sets another count (``flex_sms``)."""


def flex_sms(kernel: str, num_sms: int | None) -> int:
    """SMs the flex kernels run on: ``--moe-flex-dispatcher-num-sms``, else the backend's default."""
    return num_sms or FLEX_SMS[kernel]


def sm_rate_factor(kernel: str, num_sms: int | None) -> float:
    """The RDMA side's rate relative to the README rows, which ran on ``FLEX_SMS`` SMs and reached the NIC's
    bandwidth there (43-58 GB/s on 50 GB/s NICs): fewer SMs copy proportionally slower (each SM moves its share of
    the tokens), more SMs buy nothing past the NIC. (The NVLink side has measured SM sweeps:
    ``cost/collectives/flex_bandwidth.py``.)"""
    return min(1.0, flex_sms(kernel, num_sms) / FLEX_SMS[kernel])


def _rdma_gbyte_s(kernel: str, direction: str, ep: int) -> float:
    """The README row for this EP size: the largest measured EP not above it (EP 16 below 16, 64 above 64)."""
    table = DEEPEP_RDMA_GBYTE_S if kernel == "deepep" else HYBRIDEP_RDMA_GBYTE_S
    sizes = sorted(table)
    row = max((s for s in sizes if s <= ep), default=sizes[0])
    return table[row][direction]


@functools.lru_cache(maxsize=1024)  # a pure function of its integers; every pass of a flex dispatcher asks it
def expected_units_reached(num_experts: int, topk: int, units: int, num_groups: int | None = None,
                           group_topk: int | None = None) -> float:
    """Expected number of distinct units (ranks or nodes, each holding a contiguous block of
    ``num_experts / units`` experts, as Megatron lays experts out over EP ranks) one token's ``topk`` copies
    reach, under uniform (balanced) routing.

    Group-limited routing (router.py ``group_limited_topk``): experts form ``num_groups`` contiguous groups; a
    token picks ``group_topk`` groups, then its k experts among theirs. With random router logits (forced load
    balancing) both picks are uniform, so P(unit u not reached) = E_S[C(pool - x_S, k)] / C(pool, k), with S the
    chosen groups, pool = their experts and x_S those of them on u; summed over S by counting group subsets by
    (size, experts on u)."""
    if num_experts % units:
        raise ConfigError(f"`num_experts % units == 0` must hold, but got (num_experts={num_experts}, units={units})")
    groups = num_groups or 1
    chosen = group_topk or groups
    per_group, per_unit = num_experts // groups, num_experts // units
    pool = chosen * per_group
    total = 0.0
    for u in range(units):
        lo, hi = u * per_unit, (u + 1) * per_unit
        on_unit = [max(0, min(hi, (j + 1) * per_group) - max(lo, j * per_group)) for j in range(groups)]
        counts = [{0: 1}] + [{} for _ in range(chosen)]  # counts[c][x]: subsets of c groups with x experts on u
        for e in on_unit:
            for c in range(min(chosen, groups) - 1, -1, -1):
                for x, n in counts[c].items():
                    counts[c + 1][x + e] = counts[c + 1].get(x + e, 0) + n
        missed = sum(n * math.comb(pool - x, topk) for x, n in counts[chosen].items())
        total += 1.0 - missed / (math.comb(groups, chosen) * math.comb(pool, topk))
    return total


def flex_dispatch_time_s(kernel: str, direction: str, copies_bytes: float, topk: int, place: GroupPlacement,
                         num_experts: int, *, num_groups: int | None = None, group_topk: int | None = None,
                         nvlink_gbyte_s: float, nic_gbyte_s: float, num_sms: int | None = None,
                         gpu_name: str = "") -> float:
    """One dispatch or combine of a rank's tokens over the EP group ``place``.

    ``copies_bytes``: the rank's top-k copies as the ``alltoall`` dispatcher would send them (the trace's
    all-to-all size, busiest-rank share included), so the rank's tokens are ``copies_bytes / topk``.
    ``nvlink_gbyte_s``: the cluster's NVLink bandwidth per GPU (caps the measured rows of ``gpu_name``'s platform,
    ``cost/collectives/flex_bandwidth.py``);
    ``nic_gbyte_s``: its network bandwidth per GPU (scales the README's RDMA numbers); ``num_sms``:
    ``--moe-flex-dispatcher-num-sms`` (``sm_rate_factor``)."""
    if copies_bytes <= 0 or place.size <= 1:
        return 0.0
    token_bytes = copies_bytes / topk
    n, nodes, g = place.size, place.num_nodes, place.ranks_per_node
    ranks = expected_units_reached(num_experts, topk, n, num_groups, group_topk)
    measured = measured_nvlink_gbyte_s(gpu_name, kernel, direction, n if nodes == 1 else g, flex_sms(kernel, num_sms))
    nvlink = min(measured, nvlink_gbyte_s) * 1e9
    if nodes == 1:
        return token_bytes * ranks * (n - 1) / n / nvlink
    node_count = expected_units_reached(num_experts, topk, nodes, num_groups, group_topk)
    rdma = _rdma_gbyte_s(kernel, direction, n) * nic_gbyte_s / MEASURED_NIC_GBYTE_S * 1e9 * sm_rate_factor(kernel,
                                                                                                       num_sms)
    if place.num_leaves > 1:
        rdma /= place.spine_oversubscription
    rdma_s = token_bytes * node_count * (nodes - 1) / nodes / rdma
    nvlink_s = token_bytes * ranks * (g - 1) / g / nvlink  # copies written to the other ranks of each node
    return max(rdma_s, nvlink_s)


def sm_slowdown(kernel: str, sm_count: int, num_sms: int | None = None) -> float:
    """Compute slowdown beside the kernel: the SMs left to compute, sm_count / (sm_count - its SMs)."""
    taken = flex_sms(kernel, num_sms)
    if taken >= sm_count:
        raise ConfigError(f"`moe_flex_dispatcher_num_sms < SMs of the GPU` must hold (compute needs SMs beside the "
                          f"dispatch kernels), but got (moe_flex_dispatcher_num_sms={taken}, sm_count={sm_count}); "
                          f"lower --moe-flex-dispatcher-num-sms")
    return sm_count / (sm_count - taken)


@dataclass(frozen=True, kw_only=True)
class MoEKernels:
    """What the cost layer needs to time a model's MoE kernels (hashable: part of the pass-cost cache key)."""

    dispatcher: str
    """allgather, alltoall (NCCL), deepep or hybridep (``ModelSpec.moe_dispatcher_kernel``)."""
    num_experts: int
    topk: int
    num_groups: int | None = None
    group_topk: int | None = None
    fused: str = ""
    """Sub-regions whose memory-bound chains run fused (``cost/kernels/moe_fusion.py``)."""
    nvlink_gbyte_s: float = 0.0
    nic_gbyte_s: float = 0.0
    shared_expert_overlap: bool = False
    """``--moe-shared-expert-overlap`` (``sim/features/moe_overlap.py``)."""
    num_sms: int | None = None
    """``--moe-flex-dispatcher-num-sms``: the flex kernels' SMs (None: the backend's default)."""
    gpu_name: str = ""
    """The GPU preset, which picks the measured NVLink-side rows (``cost/collectives/flex_bandwidth.py``)."""
    grouped_single_kernel: bool = False
    """The TE op fuser's grouped MLP: a grouped GEMM is one kernel over all local experts (cost/kernels/moe_grouped_gemm.py)."""

    @property
    def experts_pad(self) -> bool:
        """Whether FP8 / FP4 experts pad their tokens themselves (workload/mlp/expert_padding.py): all but HybridEP,
        whose dispatch pads them (Megatron-LM d98e8a64ddf3 moe_utils.py ``skip_routed_expert_padding``)."""
        return self.dispatcher != "hybridep"

    @property
    def flex(self) -> bool:
        return self.dispatcher in FLEX_SMS

    def all_to_all_s(self, op, size_bytes: float, place: GroupPlacement) -> float:
        """A flex dispatcher's dispatch / combine: the forward dispatch and the backward of the combine run
        DeepEP's dispatch kernel, the others its combine kernel."""
        direction = "dispatch" if (op.subregion == "dispatch") == (op.phase == "fwd") else "combine"
        return flex_dispatch_time_s(self.dispatcher, direction, size_bytes, self.topk, place, self.num_experts,
                                    num_groups=self.num_groups, group_topk=self.group_topk,
                                    nvlink_gbyte_s=self.nvlink_gbyte_s, nic_gbyte_s=self.nic_gbyte_s,
                                    num_sms=self.num_sms, gpu_name=self.gpu_name)


def moe_kernels(model, cluster) -> MoEKernels | None:
    """The MoE kernel settings of ``model`` on ``cluster`` (None for a dense model)."""
    if not model.is_moe:
        return None

    return MoEKernels(dispatcher=model.moe_dispatcher_kernel, num_experts=model.num_experts,
                      topk=model.moe_router_topk, num_groups=model.moe_router_num_groups,
                      group_topk=model.moe_router_group_topk,
                      fused=fused_subregions(model.moe_router_fusion, model.moe_permute_fusion),
                      nvlink_gbyte_s=cluster.intra_node_bandwidth_gbyte_s,
                      nic_gbyte_s=cluster.inter_node_bandwidth_per_gpu_gbyte_s,
                      shared_expert_overlap=model.moe_shared_expert_overlap
                      and bool(model.moe_shared_expert_intermediate_size),
                      num_sms=model.moe_flex_dispatcher_num_sms if model.moe_token_dispatcher_type == "flex" else None,
                      gpu_name=cluster.gpu.name,
                      grouped_single_kernel=model.use_transformer_engine_op_fuser and model.moe_grouped_gemm)
