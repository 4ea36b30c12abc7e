"""A simulated step as the report shows it: the critical stage's step as named parts (``step_breakdown``, whose
total is the step) and the timeline of spans behind the Chrome trace (``step_timeline``)."""

from __future__ import annotations

from echo_tune.sim.outputs.report import BREAKDOWN_PARTS
from echo_tune.sim.outputs.trace_tracks import COMM_TRACK, DP_TRACK, bucket_spans, p2p_spans, pass_part_spans
from echo_tune.sim.schedule.costing import ZERO, PhaseCost


def step_breakdown(passes, m: int, compute_end_s: float, critical_p2p_s: float, tail, step_time: float,
               flush: PhaseCost = ZERO) -> dict:
    """The critical stage's step as named parts; "other" takes whatever is left (zero by construction).
    ``flush``: work after the stage's last backward (the deferred embedding wgrad)."""
    fwd_sum = sum((f for f, _, _ in passes), ZERO).scaled(m)
    bwd_sum = sum((b for _, b, _ in passes), ZERO).scaled(m) + flush
    rec_sum = sum((r for _, _, r in passes), ZERO).scaled(m)
    idle = max(0.0, compute_end_s - (fwd_sum.total_s + bwd_sum.total_s + rec_sum.total_s))
    p2p_exposed = min(critical_p2p_s, idle)
    parts = {
        "compute": fwd_sum.compute_s + bwd_sum.compute_s,
        "recompute": rec_sum.total_s,
        "tp_cp_comm": fwd_sum.comm_exposed_s + bwd_sum.comm_exposed_s,
        "ep_comm": fwd_sum.ep_comm_s + bwd_sum.ep_comm_s,
        "interference": fwd_sum.interference_s + bwd_sum.interference_s + tail.interference_s,
        "pp_bubble": idle - p2p_exposed,
        "pp_p2p": p2p_exposed,
        "dp_comm": tail.dp_exposed_s + fwd_sum.dp_comm_s + bwd_sum.dp_comm_s,  # + Megatron-FSDP's in passes
        "offload": fwd_sum.offload_s + bwd_sum.offload_s,
        "optimizer": tail.optimizer_s,
    }
    parts["other"] = step_time - sum(parts.values())
    assert tuple(parts) == BREAKDOWN_PARTS
    return parts


def step_timeline(run, tails, passes, buckets, pipeline_end_s, drains) -> list[tuple[int, str, str, float, float]]:
    """Spans (stage, name, category, start_s, end_s): every pass, then each stage's step tail; and on each
    stage's communication tracks the exposed parts of each pass, its DP buckets and its p2p transfers (see
    trace_tracks.py), so that the blocks of the critical stage add up to its breakdown."""
    events, compute_end_s = run.events, run.end_s
    busy_s = [0.0] * len(compute_end_s)
    for stage, _, _, _, start, end in events:
        busy_s[stage] += end - start
    for stage, (flush_start, end) in enumerate(zip(pipeline_end_s, compute_end_s)):
        busy_s[stage] += end - flush_start  # the deferred embedding wgrad flush (sim/features/deferred_wgrad.py)
    idle_s = [end - busy for end, busy in zip(compute_end_s, busy_s)]

    spans = [(stage, f"{'B' if backward else 'F'}{mb}" + (f".{chunk}" if chunk else ""),
              "backward" if backward else "forward", start, end)
             for stage, backward, mb, chunk, start, end in events]
    spans += pass_part_spans(events, passes) + bucket_spans(buckets) + p2p_spans(run.transfers,
                                                                                 run.critical_transfers, idle_s)
    for stage, (end, tail) in enumerate(zip(compute_end_s, tails)):
        if end > pipeline_end_s[stage]:
            spans.append((stage, "deferred embedding wgrad (flush)", "backward", pipeline_end_s[stage], end))
            if drains[stage].comm_exposed_s > 0:  # its input all-gathers not hidden by the GEMMs
                spans.append((COMM_TRACK + stage, "TP/CP collectives (exposed)", "tp_cp_comm",
                              end - drains[stage].comm_exposed_s, end))
        dp_end = end + tail.dp_exposed_s
        if dp_end > end:
            spans.append((stage, "gradient reduction (exposed)", "dp_comm", end, dp_end))
        if tail.interference_s > 0:
            spans.append((stage, "DP overlap slow-down", "interference", dp_end, dp_end + tail.interference_s))
        opt_start = dp_end + tail.interference_s
        spans.append((stage, "optimizer step", "optimizer", opt_start, opt_start + tail.optimizer_s))
        if tail.param_gather_hidden_s > 0:  # --overlap-param-gather-with-optimizer-step, on the DP track
            gather_end = opt_start + tail.optimizer_s
            spans.append((DP_TRACK + stage, "first bucket's param all-gather (hidden behind the optimizer step)",
                          "param_gather", gather_end - tail.param_gather_hidden_s, gather_end))
    return spans
