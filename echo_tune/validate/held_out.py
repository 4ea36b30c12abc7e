"""Each validated row's error out of sample: what the bands (plan/bands.py) and the accuracy page use."""

from __future__ import annotations
from echo_tune.cost.host.host_time import shipped_fit


def out_of_sample_errors(cases_and_results) -> list[float]:
    """Each row's error out of sample: the leave-one-source-out error the shipped host-time fit stored for the rows
    it was fitted on (``cost/host/host_time.py``), the plain error for the others."""
    held_out = {(r.get("name"), r.get("source")): r["loso_error_pct"] for r in (shipped_fit().get("rows") or [])
                if isinstance(r, dict) and "loso_error_pct" in r}
    return [held_out.get((case.name, case.source), result.error_pct) for case, result in cases_and_results]
