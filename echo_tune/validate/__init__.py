"""Validate the simulator against measured runs (``echo-tune validate``)."""

from echo_tune.validate.compare import RowResult, by_source, simulate_case, spearman, summarize
from echo_tune.validate.runs import REQUIRED_COLUMNS, RunCase, read_runs


def validate(path, errata=True) -> tuple[list[RowResult], dict, dict]:
    """Simulate every row of a runs CSV: (rows, overall summary, summary by source). ``errata``: see
    ``read_runs`` (the dataset's source-stated settings; False leaves them out)."""
    rows = [simulate_case(case) for case in read_runs(path, errata)]
    return rows, summarize(rows), by_source(rows)


__all__ = ["REQUIRED_COLUMNS", "RowResult", "RunCase", "by_source", "read_runs", "simulate_case", "spearman",
           "summarize", "validate"]
