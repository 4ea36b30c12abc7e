"""NCCL's fixed tuning constants, as the collective model (``cost/collectives/comm.py``) uses them.

Every number here is fixed in NCCL's code, not measured on a cluster. Source: NCCL 2.30.7
(``makefiles/version.mk``: NCCL_MAJOR 2, NCCL_MINOR 30, NCCL_PATCH 7), ``src/graph/tuning.cc``
at commit 5067397c2676 of github.com/NVIDIA/nccl: ``ncclTunerConstantsDefaults``,
``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``. Only ratios and shapes are taken from NCCL; the
cluster-dependent terms (link bandwidths, per-hop latencies, per-call latencies) are fitted
(``calibrate/fit/fit_comm.py``), because NCCL's absolute defaults are a tuner's guesses for choosing
an algorithm, not a time prediction.
"""

from __future__ import annotations

NCCL_VERSION = "2.30.7"
NCCL_SOURCE = "NCCL 2.30.7 src/graph/tuning.cc (commit 5067397c2676)"

PROTOCOLS = ("ll", "ll128", "simple")

# treeCorrectionFactor[protocol][log2(nBytes / 64)] for 64 B to 256 MiB (ncclTopoGetAlgoTime):
# "Trees are not perfectly sticking to the model for medium sizes"; factor 1 outside the table.
_TREE_CORRECTION = {
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
}

# Ring Simple all-reduce across nodes: latency *= 1.4 on compute capability >= 8.0 (1.9 before),
# "plateau effect of ring" (ncclTopoGetAlgoTime).
RING_SIMPLE_PLATEAU = 1.4


# --- NCCL's own algorithm choice (ncclTopoTuneModel + ncclTopoGetAlgoTime, NCCL 2.30.7) ---
# NCCL runs the (algorithm, protocol) its tuner *estimates* fastest, with its own constants; the
# model times that choice with the fitted terms. The A100 logs name no NCCL release (no NCCL_DEBUG
# lines; the nccl-tests layout predates the "Group" rank column); NetX-lab/Echo's environment pins
# torch 2.1.2, whose CUDA 12 wheels ship NCCL 2.18. NCCL 2.18.3 has the same latencies, tree
# factors, treeCorrectionFactor and per-node-count regimes, except that it counts 2N network steps
# of a ring all-reduce where 2.30.7 counts 2(N-1), and rates ring LL at busBw / 4 (2.30.7: * .5).
# baseLatencies (us), ncclTunerConstantsDefaults: Tree {LL 6.8, LL128 14.0, Simple 8.4}, Ring {6.6, 14.0, 8.4}.
BASE_LATENCY_US = {"tree": {"ll": 6.8, "ll128": 14.0, "simple": 8.4}, "ring": {"ll": 6.6, "ll128": 14.0, "simple": 8.4}}
# hwLatencies (us) per hop: NVLINK Tree {.6, 1.25, 4.0} Ring {.6, 1.9, 3.4};
# NET Tree {5.0, 8.5, 14} Ring {2.7, 4.0, 14.0} (LL, LL128, Simple).
NVLINK_HOP_US = {"tree": {"ll": 0.6, "ll128": 1.25, "simple": 4.0}, "ring": {"ll": 0.6, "ll128": 1.9, "simple": 3.4}}
NET_HOP_US = {"tree": {"ll": 5.0, "ll128": 8.5, "simple": 14.0}, "ring": {"ll": 2.7, "ll128": 4.0, "simple": 14.0}}
# getNetOverhead (us): 1.0 on Intel and other CPUs (2.0 on AMD), x3 for Simple; every intra-node step
# of a ring that crosses nodes costs at least this. The cluster's CPU vendor is not a cluster key, so
# the default (1.0) is used.
NET_OVERHEAD_US = 1.0
# Bus bandwidth of each protocol relative to Simple on the same links (ncclTopoTuneModel): ring LL busBw * .5,
# ring LL128 * .92; every tree all-reduce busBw * .92, then LL / 3.8, LL128 * 120/128 across nodes.
RING_PROTOCOL_BANDWIDTH = {"ll": 0.5, "ll128": 0.92, "simple": 1.0}
TREE_PROTOCOL_BANDWIDTH = {"ll": 0.92 / 3.8, "ll128": 0.92 * 120.0 / 128.0, "simple": 0.92}

# A tree all-reduce moves the buffer twice (reduce up, broadcast down): algbw = busBw * .5
# ("Convert bus BW to algorithm BW", ratio .5 for every algorithm but ring / NVLS).
TREE_ALGBW_RATIO = 0.5

# --- derived from the tables above (one copy of each NCCL number) ---
# Default network per-hop latency of a ring, hwLatencies[NCCL_HW_NET][NCCL_ALGO_RING]; used only where no
# measurement across nodes exists.
NET_RING_HOP_LATENCY_S = {p: us * 1e-6 for p, us in NET_HOP_US["ring"].items()}
# Tree hop latency relative to the ring's of the same protocol, per link kind.
TREE_VS_RING_NET_HOP = {p: NET_HOP_US["tree"][p] / NET_HOP_US["ring"][p] for p in PROTOCOLS}
TREE_VS_RING_NVLINK_HOP = {p: NVLINK_HOP_US["tree"][p] / NVLINK_HOP_US["ring"][p] for p in PROTOCOLS}
# Bandwidth of a tree all-reduce relative to a ring of the same protocol over the same links.
TREE_VS_RING_BANDWIDTH = {p: TREE_PROTOCOL_BANDWIDTH[p] / RING_PROTOCOL_BANDWIDTH[p] for p in PROTOCOLS}


def tree_depth(num_nodes: int) -> int:
    """Network levels of NCCL's double binary tree across ``num_nodes`` nodes: NCCL's ``log2i(nNodes)``,
    which is ``log2Down``, floor(log2) (src/include/utils.h and src/include/bitops.h at 5067397c2676), as
    the tree latency of ncclTopoTuneModel (src/graph/tuning.cc) and connectTrees' depth
    (src/graph/connect.cc) use it: 1 for 2 or 3 nodes, 2 for 4 to 7. The one rule of echo-tune for
    the tree's time and for NCCL's algorithm choice alike."""
    return max(int(num_nodes), 1).bit_length() - 1

def nccl_picks_tree(protocol: str, size_bytes: float, size: int, num_nodes: int, ranks_per_node: int,
                    graph_bus_bytes_per_us: float) -> bool:
    """Whether NCCL's tuner estimates the tree all-reduce faster than the ring, for one protocol.

    ``graph_bus_bytes_per_us`` is the bus bandwidth NCCL's tuner sees, nChannels x graph bandwidth:
    ``bw = nNodes <= 2 ? bwIntra : bwInter`` (ncclTopoTuneModel), i.e. the node's NVLink bandwidth
    up to two nodes and its network bandwidth beyond. Not modelled: the per-channel caps
    (perChMaxTreeBws, llMaxBws, ...), which need NCCL's channel count and never bind below
    ~18 GB/s per channel, and the PCI / CollNet / NVLS / PAT cases.
    """
    steps, network_steps = 2 * (size - 1), 2 * (num_nodes - 1)
    overhead = NET_OVERHEAD_US * (3.0 if protocol == "simple" else 1.0)
    ring_latency = BASE_LATENCY_US["ring"][protocol] + (steps - network_steps) * max(
        NVLINK_HOP_US["ring"][protocol], overhead) + network_steps * NET_HOP_US["ring"][protocol]
    if protocol == "simple":
        ring_latency *= RING_SIMPLE_PLATEAU
    tree_latency = BASE_LATENCY_US["tree"][protocol] + 2 * ((ranks_per_node - 1) * NVLINK_HOP_US["tree"][protocol]
                                                            + tree_depth(num_nodes) * NET_HOP_US["tree"][protocol])
    ring_bw = graph_bus_bytes_per_us * RING_PROTOCOL_BANDWIDTH[protocol] * size / steps
    tree_bw = (graph_bus_bytes_per_us * TREE_PROTOCOL_BANDWIDTH[protocol] * TREE_ALGBW_RATIO
               * tree_correction(protocol, size_bytes))
    return tree_latency + size_bytes / tree_bw < ring_latency + size_bytes / ring_bw


def tree_correction(protocol: str, size_bytes: float) -> float:
    """NCCL's medium-size correction of tree bandwidth (``treeCorrectionFactor``)."""
    units = int(size_bytes) >> 6
    if units <= 0:
        return 1.0
    log_size = units.bit_length() - 1
    table = _TREE_CORRECTION.get(protocol, _TREE_CORRECTION["simple"])
    return table[log_size] if log_size < len(table) else 1.0


def tier_protocol(name: str) -> str:
    """The NCCL protocol a profile tier stands for ("simple", "ll128", "ll"; other names as Simple)."""
    return name if name in PROTOCOLS else "simple"

