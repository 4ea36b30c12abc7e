"""Validate the simulator against measured runs (``echo-tune validate``)."""

from echo_tune.validate.compare import RowResult, by_source, simulate_case, spearman, summarize
from echo_tune.validate.runs import REQUIRED_COLUMNS, RunCase, read_runs


def validate(path) -> tuple[list[RowResult], dict, dict]:
    """Simulate every row of a runs CSV: (rows, overall summary, summary by source)."""
    rows = [simulate_case(case) for case in read_runs(path)]
    return rows, summarize(rows), by_source(rows)


__all__ = ["REQUIRED_COLUMNS", "RowResult", "RunCase", "by_source", "read_runs", "simulate_case", "spearman",
           "summarize", "validate"]
