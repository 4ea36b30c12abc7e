"""Communication tracks of the Chrome trace: each pass's exposed parts, as blocks the breakdown adds up.

A pass (forward or backward of one chunk for one micro-batch) lasts compute + exposed TP/CP communication +
MoE dispatch + interference (+ recompute before a backward). The simulator times these parts, not where in the
pass each collective falls, so the communication track of a stage (tid ``COMM_TRACK + stage``) draws them as
consecutive blocks at the end of their pass, in the categories of the breakdown: summed over the critical
stage, the ``tp_cp_comm``, ``ep_comm``, ``interference`` and ``recompute`` blocks equal those breakdown parts
(checked in tests/sim/test_trace_tracks.py). A third track per stage (tid ``DP_TRACK + stage``) holds the DP
gradient buckets as ``sim/dp.py`` schedules them. Pipeline p2p transfers are not drawn (the breakdown's
``pp_p2p`` is the part of the idle time they explain; the schedule does not place them as spans).
"""

from __future__ import annotations

COMM_TRACK = 1000
"""Thread id offset of the communication tracks (stage s: COMM_TRACK + s)."""
DP_TRACK = 2000
"""Thread id offset of the data-parallel gradient buckets (stage s: DP_TRACK + s): each bucket's
reduce-scatter (distributed optimizer) or all-reduce from its start to its end, hidden behind the backward
passes or, after the last one, exposed (the exposed part is the breakdown's ``dp_comm`` less the tied-embedding
sync)."""

_PARTS = (("recompute", "recompute"), ("comm_exposed_s", "tp_cp_comm"), ("ep_comm_s", "ep_comm"),
          ("interference_s", "interference"))
_NAMES = {"recompute": "recompute (forward again)", "tp_cp_comm": "TP/CP collectives (exposed)",
          "ep_comm": "MoE dispatch/combine", "interference": "compute-communication interference"}


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
    return [(DP_TRACK + stage, f"gradient bucket ({params / 1e6:.0f}M params)", "dp_bucket", begin, end)
            for stage, spans in enumerate(buckets or []) for begin, end, params in spans if end > begin]
