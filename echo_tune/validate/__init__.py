"""Validate the simulator against measured runs (``echo-tune validate``)."""

import dataclasses

from echo_tune.validate.compare import RowResult, by_source, simulate_case, spearman, summarize
from echo_tune.validate.runs import REQUIRED_COLUMNS, RunCase, read_runs


def validate(path, errata=True, profiles=None, gpu_clock_mhz=None) -> tuple[list[RowResult], dict, dict]:
    """Simulate every row of a runs CSV: (rows, overall summary, summary by source). ``errata``: see
    ``read_runs`` (the dataset's source-stated settings; False leaves them out). ``profiles``: {GPU name:
    profile} for the rows on that GPU (a fitted profile marks the rows it was fitted on as in-sample).
    ``gpu_clock_mhz``: every row's cluster at this sustained clock (``--gpu-clock-mhz``)."""
    cases = read_runs(path, errata)
    if gpu_clock_mhz is not None:
        cases = [dataclasses.replace(c, cluster=c.cluster.replace(sustained_clock_mhz=float(gpu_clock_mhz)))
                 if c.cluster is not None else c for c in cases]
    rows = [simulate_case(case, profiles) for case in cases]
    return rows, summarize(rows), by_source(rows)


__all__ = ["REQUIRED_COLUMNS", "RowResult", "RunCase", "by_source", "read_runs", "simulate_case", "spearman",
           "summarize", "validate"]
