"""Communication tracks of the Chrome trace: each pass's exposed parts, as blocks the breakdown adds up.

A pass (forward or backward of one chunk for one micro-batch) lasts compute + exposed TP/CP communication +
MoE dispatch + interference (+ recompute before a backward). The simulator times these parts, not where in the
pass each collective falls, so the communication track of a stage (tid ``COMM_TRACK + stage``) draws them as
consecutive blocks at the end of their pass, in the categories of the breakdown: summed over the critical
stage, the ``tp_cp_comm``, ``ep_comm``, ``interference`` and ``recompute`` blocks equal those breakdown parts
(checked in tests/sim/test_trace_tracks.py). Pipeline p2p transfers are not drawn (the breakdown's
``pp_p2p`` is the part of the idle time they explain; the schedule does not place them as spans).
"""

from __future__ import annotations

COMM_TRACK = 1000
"""Thread id offset of the communication tracks (stage s: COMM_TRACK + s)."""

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
