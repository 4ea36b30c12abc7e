"""Chrome-trace (Perfetto) export of a simulated timeline: one track per pipeline stage."""

from __future__ import annotations

import json
from pathlib import Path

from echo_tune.io import write_text
from echo_tune.sim.report import StepReport


def chrome_trace_events(report: StepReport) -> list[dict]:
    events = []
    stages = {e[0] for e in report.timeline}
    for stage in sorted(stages):
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": stage,
                       "args": {"name": f"pipeline stage {stage}"}})
    for stage, name, category, start_s, end_s in report.timeline:
        events.append({"name": name, "cat": category, "ph": "X", "pid": 0, "tid": stage,
                       "ts": start_s * 1e6, "dur": (end_s - start_s) * 1e6})
    return events


def write_chrome_trace(report: StepReport, path: str | Path) -> None:
    """Write ``{"traceEvents": [...]}``; times in microseconds as the format wants."""
    write_text(path, json.dumps({"traceEvents": chrome_trace_events(report), "displayTimeUnit": "ms",
                                "otherData": {"step_time_s": report.step_time_s,
                                              "breakdown_s": report.breakdown_s}}), "--trace file")
