"""Communication tracks of the Chrome trace: each pass's exposed parts, as blocks the breakdown adds up.

A pass (forward or backward of one chunk for one micro-batch) lasts compute + exposed TP/CP communication +
MoE dispatch + interference (+ recompute before a backward). The simulator times these parts, not where in the
pass each collective falls, so the communication track of a stage (tid ``COMM_TRACK + stage``) draws them as
consecutive blocks at the end of their pass, in the categories of the breakdown: summed over the critical
stage, the ``tp_cp_comm``, ``ep_comm``, ``interference`` and ``recompute`` blocks equal those breakdown parts
(checked in tests/sim/test_trace_tracks.py). A third track per stage (tid ``DP_TRACK + stage``) holds the DP
gradient buckets as ``sim/data_parallel/dp.py`` schedules them. Pipeline p2p transfers get two more kinds of track per
stage: the transfers on the critical path that ends at the stage's last pass (tid ``P2P_TRACK + stage``; on the
critical stage their ``pp_p2p`` blocks add up to the breakdown's ``pp_p2p``), and every transfer the stage
receives as the engine schedules it (tid ``TRANSFER_TRACK + lane * COMM_TRACK + stage``; transfers that
overlap in time go to further lanes, as a trace thread holds one block at a time).
"""

from __future__ import annotations

COMM_TRACK = 1000
"""Thread id offset of the communication tracks (stage s: COMM_TRACK + s)."""
DP_TRACK = 2000
"""Thread id offset of the data-parallel gradient buckets (stage s: DP_TRACK + s): each bucket's
reduce-scatter (distributed optimizer) or all-reduce from its start to its end, hidden behind the backward
passes or, after the last one, exposed (the exposed part is the breakdown's ``dp_comm`` less the tied-embedding
sync)."""

P2P_TRACK = 3000
"""Thread id offset of the critical-path p2p transfers (stage s: P2P_TRACK + s)."""
TRANSFER_TRACK = 4000
"""Thread id offset of all p2p transfers a stage receives (lane k of stage s: TRANSFER_TRACK + k * COMM_TRACK + s)."""

_PARTS = (("recompute", "recompute"), ("comm_exposed_s", "tp_cp_comm"), ("ep_comm_s", "ep_comm"),
          ("dp_comm_s", "dp_comm"), ("offload_s", "offload"), ("interference_s", "interference"))
_NAMES = {"recompute": "recompute (forward again)", "tp_cp_comm": "TP/CP collectives (exposed)",
          "ep_comm": "MoE dispatch/combine", "dp_comm": "FSDP all-gather / reduce-scatter (exposed)",
          "offload": "activation copies to / from the host (exposed)",
          "interference": "compute-communication interference"}


def pass_part_spans(events, passes) -> list[tuple[int, str, str, float, float]]:
    """Blocks of each pass's non-compute parts, ending where the pass ends."""
    spans = []
    for stage, backward, mb, chunk, start, end in events:
        fwd, bwd, rec = passes[stage][chunk]
        cost = bwd if backward else fwd
        parts = [(category, getattr(cost, attr)) for attr, category in _PARTS if attr != "recompute"]
        if backward:
            parts.insert(0, ("recompute", rec.total_s))
        t = end - sum(d for _, d in parts)
        for category, duration in parts:
            if duration > 0:
                spans.append((COMM_TRACK + stage, _NAMES[category], category, t, t + duration))
            t += duration
    return spans


def bucket_spans(buckets: list[list[tuple[float, float, int]]] | None) -> list[tuple[int, str, str, float, float]]:
    """Each stage's DP gradient buckets, on its DP track (a bucket over a group of one rank takes no time and
    is left out)."""
    return [(DP_TRACK + stage, f"gradient bucket ({params:,} params)", "dp_bucket", begin, end)
            for stage, spans in enumerate(buckets or []) for begin, end, params in spans if end > begin]


def _label(transfer) -> str:
    src, dst, backward, mb, chunk, _, _ = transfer
    what = f"{'B' if backward else 'F'}{mb}" + (f".{chunk}" if chunk else "")
    return f"{'gradient' if backward else 'activation'} {what}: stage {src} -> {dst}"


def p2p_spans(transfers, critical, idle_s) -> list[tuple[int, str, str, float, float]]:
    """Per stage: its critical path's transfers (``P2P_TRACK``) and every transfer it receives (lanes from
    ``TRANSFER_TRACK``).

    The breakdown counts critical-path p2p as exposed only up to the stage's idle time (``idle_s[stage]``,
    sim/simulate.py ``_breakdown``): blocks past that cap are cut and the rest drawn as ``p2p_hidden``
    (the path then holds less compute than the stage, which computes while those transfers fly)."""
    spans = []
    for stage, path in enumerate(critical):
        left = idle_s[stage]
        for index in path:
            start, end = transfers[index][5:]
            exposed = min(end - start, max(0.0, left))
            left -= exposed
            if exposed > 0:
                spans.append((P2P_TRACK + stage, f"{_label(transfers[index])} (critical path)", "pp_p2p",
                              start, start + exposed))
            if start + exposed < end:
                spans.append((P2P_TRACK + stage, f"{_label(transfers[index])} (critical path, beyond the idle "
                              f"time)", "p2p_hidden", start + exposed, end))
    lanes: dict[int, list[float]] = {}  # per stage, the end of the last transfer in each lane
    for transfer in sorted(transfers, key=lambda t: (t[1], t[5], t[6])):
        stage, start, end = transfer[1], transfer[5], transfer[6]
        ends = lanes.setdefault(stage, [])
        lane = next((k for k, t in enumerate(ends) if t <= start), len(ends))
        if lane == len(ends):
            ends.append(end)
        ends[lane] = end
        spans.append((TRANSFER_TRACK + lane * COMM_TRACK + stage, _label(transfer), "p2p", start, end))
    return spans
