"""Days, GPU-hours and cost to train, carrying the error band's bias and a goodput factor.

A prediction's band (``bands.band_summary``) holds its validated family's median measured / predicted step
time and the lowest..highest of it. The expected wall time is the predicted training time times the median
(the family's bias: the H100 rows all took longer than predicted), divided by the goodput, the share of wall
time spent training (failures, restarts, checkpoints and evaluation take the rest); the band's range gives
the low..high of days, GPU-hours and cost. A deadline is "met" when even the high end meets it, "missed" when
even the low end misses it, and "at risk" when the band crosses it.

Default goodput 0.90: Meta's Llama 3 405B pre-training on up to 16K H100 GPUs reached "higher than 90%
effective training time" over a 54-day snapshot with 466 job interruptions (Dubey et al. 2024, "The Llama 3
Herd of Models", arXiv 2407.21783, section 3.3.4 "Reliability and Operational Challenges"). ``--goodput 1``
prices training time alone.

Where no band applies (a measured or fitted profile: the bands were validated with the datasheet profiles
only, ``bands.band_applies``), the median is 1 and there is no range.
"""

from __future__ import annotations

from echo_tune.errors import ConfigError

GOODPUT_DEFAULT = 0.90
"""Share of wall time spent training (Llama 3 paper, section 3.3.4: "higher than 90% effective training time")."""


def check_goodput(goodput: float) -> float:
    if not (isinstance(goodput, (int, float)) and 0.0 < goodput <= 1.0):
        raise ConfigError(f"`0 < --goodput <= 1` must hold, but got (goodput={goodput!r}); it is the share of wall "
                          f"time spent training, e.g. 0.9")
    return float(goodput)


def deadline_status(days_low: float, days_high: float, deadline_days: float | None,
                    days: float | None = None) -> str | None:
    """"met", "at risk" (met by the expected ``days``, but the band crosses the deadline) or "missed" (the
    expected days are over it: one rule with ``meets_deadline``); None without a deadline."""
    if deadline_days is None:
        return None
    if days_high <= deadline_days:
        return "met"
    expected = days if days is not None else days_low
    return "missed" if expected > deadline_days else "at risk"


def budget_status(cost: float | None, cost_band: tuple[float, float] | None, budget: float | None) -> str | None:
    """"within" (even the band's high end), "at risk" (the band crosses the budget) or "over" (even its low
    end); None without a budget or a price."""
    if budget is None or cost is None:
        return None
    low, high = cost_band or (cost, cost)
    if high <= budget:
        return "within"
    return "over" if cost > budget else "at risk"  # the expected cost decides, as ``within_budget`` does


def project(train_s: float, band: dict | None, *, num_gpus: int, gpu_hour_price: float | None = None,
            deadline_days: float | None = None, goodput: float = GOODPUT_DEFAULT) -> dict:
    """Expected days / GPU-hours / cost of ``train_s`` seconds of predicted training, with the band's median
    applied and its range (``*_band``: low, high; None without a band), over ``goodput``."""
    goodput = check_goodput(goodput)
    wall_s = train_s / goodput
    if band is not None and band.get("measured_over_predicted"):
        mid = band["median_measured_over_predicted"]
        lo, hi = band["measured_over_predicted"]
    else:
        mid, lo, hi = 1.0, None, None
    days = wall_s * mid / 86400.0
    days_band = None if lo is None else (wall_s * lo / 86400.0, wall_s * hi / 86400.0)
    hours = days * 24.0 * num_gpus
    hours_band = None if days_band is None else tuple(d * 24.0 * num_gpus for d in days_band)
    cost = None if gpu_hour_price is None else hours * gpu_hour_price
    cost_band = None if cost is None or hours_band is None else tuple(h * gpu_hour_price for h in hours_band)
    low, high = days_band or (days, days)
    return {"days": days, "days_band": days_band, "gpu_hours": hours, "gpu_hours_band": hours_band,
            "cost": cost, "cost_band": cost_band, "goodput": goodput, "bias": mid,
            "deadline": deadline_status(low, high, deadline_days, days)}


def range_cell(value: float | None, band: tuple[float, float] | None, fmt: str) -> str:
    """"12.3 (11.0-14.1)" for a table cell; "-" for no value."""
    if value is None:
        return "-"
    return format(value, fmt) + ("" if band is None else f" ({format(band[0], fmt)}-{format(band[1], fmt)})")


def deadline_note(row: dict) -> str | None:
    """The planner's / ranker's note on a row's deadline, or None."""
    return {"missed": "misses the deadline", "at risk": "deadline at risk: the error band crosses it"}.get(
        row.get("deadline"))


def budget_note(row: dict) -> str | None:
    """The planner's note on a row's budget, or None ("over budget" where the expected cost is over)."""
    return {"over": "over budget", "at risk": "budget at risk: the cost band crosses it"}.get(row.get("budget"))


def legend(rows: list[dict]) -> str:
    """The line under a planner / ranker table saying what the band, days and cost columns hold."""
    goodputs = sorted({r["goodput"] for r in rows if r.get("goodput") is not None})
    goodput = "/".join(f"{g:.2f}" for g in goodputs) or f"{GOODPUT_DEFAULT:.2f}"
    return ("error band: the prediction error of the validated runs of the prediction's family, out of sample "
            "(predicted - measured, in % of measured: negative = predicted too fast), median (5th..95th percentile, n "
            "runs; a family of fewer than 3 runs takes its GPU and kind's runs together, 'pooled', widened to cover "
            "its own runs, and where they are fewer too 'unvalidated', the band of all runs); days, GPU-hours and "
            f"cost: the predicted training time corrected by that median / goodput {goodput} (share of wall time spent training; Llama 3 "
            "405B: >90%), in brackets the band applied; free HBM: HBM less the peak (\"spare\" in notes: under HBM "
            "less the headroom)")


SORT_KEYS = ("time", "cost")


def sort_rows(rows: list[dict], by: str) -> list[dict]:
    """Feasible rows by days (then cost) or by cost (then days), the infeasible ones after them."""
    if by not in SORT_KEYS:
        raise ConfigError(f"`--sort` must be one of {list(SORT_KEYS)}, but got ({by!r})")
    inf = float("inf")
    key = (lambda r: (r["days"], r["cost"] if r["cost"] is not None else inf)) if by == "time" else \
        (lambda r: (r["cost"] if r["cost"] is not None else inf, r["days"]))
    feasible = sorted((r for r in rows if r["feasible"]), key=key)
    return feasible + [r for r in rows if not r["feasible"]]
