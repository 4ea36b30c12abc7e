"""The plan's coverage line names why layouts went unsimulated, rule by rule (search/space/dominance.py)."""

from __future__ import annotations

from echo_tune.plan.report import _dominated


def test_the_coverage_line_counts_each_rule():
    assert _dominated({"n_dominated": 0}) == ""
    assert _dominated({"n_dominated": 845}) == \
        ", 845 of them not simulated: recompute variants, 845 of a layout that fits without it"
    assert _dominated({"n_dominated": 900, "n_dominated_memory": 55}) == (
        ", 900 of them not simulated: recompute variants, 845 of a layout that fits without it and 55 of a layout "
        "over memory without its activations")
    assert _dominated({"n_dominated": 55, "n_dominated_memory": 55}) == \
        ", 55 of them not simulated: recompute variants, 55 of a layout over memory without its activations"


def test_the_breakdown_rows_are_in_one_order_whatever_the_string_hashing():
    """Parts tied to the microsecond (zeros, float residue) come by name, not in a set's order (which changes
    with the process's string hashing: a plan run and its rerun printed them in different orders)."""
    from echo_tune.plan.report import explanation_tables

    def family(label: str, compute: float, other: float, bubble: float) -> dict:
        return {"breakdown_s": {"compute": compute, "other": other, "ep_comm": 0.0, "recompute": 0.0,
                                "pp_bubble": bubble}, "common": "", "label": label, "family": label,
                "step_time_s": compute + bubble, "headroom_gib": 4.9}
    fams = [family("TP4 PP4 CP1", 9.0, 2e-16, 0.9), family("TP4 PP2 CP1", 9.1, -1e-16, 0.8)]
    breakdown, _ = explanation_tables({"families": fams, "sensitivity": [
        {"assumption": "as modelled", "step_time_s": [9.9, 9.9], "fastest": 0}]})
    assert [row[0] for row in breakdown.rows] == ["compute", "pp_bubble", "ep_comm", "other", "recompute", "step",
                                                  "free HBM GiB"]
