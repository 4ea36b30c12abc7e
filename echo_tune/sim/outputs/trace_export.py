"""Chrome-trace (Perfetto) export of a simulated timeline: per pipeline stage a track of passes and step tail,
tracks of each pass's exposed communication, interference and recompute, DP buckets and p2p transfers
(``trace_tracks.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from echo_tune.io import write_text
from echo_tune.sim.outputs.report import StepReport
from echo_tune.sim.outputs.trace_tracks import COMM_TRACK


def process_name(report: StepReport) -> str:
    """What the trace's one process is: the simulated step of this model, cluster and layout."""
    cfg = report.config
    sizes = " ".join(f"{short}{cfg[key]}" for key, short in (
        ("tensor_model_parallel_size", "TP"), ("pipeline_model_parallel_size", "PP"),
        ("context_parallel_size", "CP"), ("data_parallel_size", "DP"), ("expert_model_parallel_size", "EP"))
        if cfg.get(key) is not None)
    return (f"echo-tune simulated step: {cfg.get('model')} on {cfg.get('num_gpus')} x {cfg.get('cluster')}, {sizes}, "
            f"{report.step_time_s:.3f} s")


def chrome_trace_events(report: StepReport) -> list[dict]:
    """Metadata (process and thread names, thread order), then one complete event per span with its ``args``
    (stage, micro-batch, chunk, pass, FLOPs, bytes: sim/outputs/trace_args.py)."""
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": process_name(report)}},
              {"name": "process_labels", "ph": "M", "pid": 0,
               "args": {"labels": f"profile {report.profile}; critical stage {report.critical_stage}"}}]
    stages = {e[0] for e in report.timeline}
    for tid in sorted(stages):
        stage, track = tid % COMM_TRACK, tid // COMM_TRACK
        names = (f"pipeline stage {stage}", f"pipeline stage {stage}: exposed communication, interference, "
                 f"recompute", f"pipeline stage {stage}: DP gradient buckets",
                 f"pipeline stage {stage}: p2p on its critical path")
        name = names[track] if track < len(names) else \
            f"pipeline stage {stage}: p2p received (lane {track - len(names)})"
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid, "args": {"name": name}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 0, "tid": tid,
                       "args": {"sort_index": 1000 * stage + track}})
    args = report.timeline_args or [{"stage": tid % COMM_TRACK, "category": cat} for tid, _, cat, _, _ in
                                    report.timeline]
    for (stage, name, category, start_s, end_s), extra in zip(report.timeline, args):
        events.append({"name": name, "cat": category, "ph": "X", "pid": 0, "tid": stage,
                       "ts": start_s * 1e6, "dur": (end_s - start_s) * 1e6, "args": dict(extra)})
    return events


def write_chrome_trace(report: StepReport, path: str | Path) -> None:
    """Write ``{"traceEvents": [...]}``; times in microseconds as the format wants."""
    write_text(path, json.dumps({"traceEvents": chrome_trace_events(report), "displayTimeUnit": "ms",
                                "otherData": {"step_time_s": report.step_time_s,
                                              "breakdown_s": report.breakdown_s}}), "--trace file")
