"""Days, GPU-hours and cost carry the band's median and range and the goodput (plan/projection.py); a deadline
is met, at risk (the band crosses it) or missed. Expected values worked by hand."""

import pytest

from echo_tune.errors import ConfigError
from echo_tune.plan.projection import GOODPUT_DEFAULT, deadline_note, deadline_status, project, range_cell

# a family whose runs took 6..18% longer than predicted, median 10%
BAND = {"median_measured_over_predicted": 1.10, "measured_over_predicted": [1.06, 1.18]}
DAY = 86400.0


def test_median_range_and_goodput_are_applied_to_days_hours_and_cost():
    # 9 predicted days on 100 GPUs at 2 per GPU-hour, goodput 0.9: wall 10 days before the bias
    p = project(9 * DAY, BAND, num_gpus=100, gpu_hour_price=2.0, goodput=0.9)
    assert p["days"] == pytest.approx(11.0)                      # 10 x 1.10
    assert p["days_band"] == (pytest.approx(10.6), pytest.approx(11.8))
    assert p["gpu_hours"] == pytest.approx(11.0 * 24 * 100)      # 26,400
    assert p["gpu_hours_band"] == (pytest.approx(25440.0), pytest.approx(28320.0))
    assert p["cost"] == pytest.approx(52800.0) and p["cost_band"] == (pytest.approx(50880.0), pytest.approx(56640.0))
    assert p["bias"] == 1.10 and p["goodput"] == 0.9 and p["deadline"] is None


def test_without_a_band_only_the_goodput_applies():
    p = project(9 * DAY, None, num_gpus=8, goodput=0.9)
    assert p["days"] == pytest.approx(10.0) and p["days_band"] is None and p["cost"] is None and p["cost_band"] is None
    assert project(9 * DAY, None, num_gpus=8, goodput=1.0)["days"] == pytest.approx(9.0)
    assert GOODPUT_DEFAULT == 0.9


@pytest.mark.parametrize("deadline, status", [(12.0, "met"), (11.8, "met"), (11.05, "at risk"), (10.9, "missed"),
                                              (10.6, "missed"), (10.5, "missed")])
def test_deadline_is_at_risk_when_the_band_crosses_it(deadline, status):
    # the expected days (11.0) decide met or missed, as meets_deadline does; "at risk": met, but the band crosses
    p = project(9 * DAY, BAND, num_gpus=1, deadline_days=deadline, goodput=0.9)  # band 10.6 .. 11.8 days
    assert p["deadline"] == status
    assert deadline_note(p) == {"met": None, "at risk": "deadline at risk: the error band crosses it",
                                "missed": "misses the deadline"}[status]
    assert deadline_status(5.0, 5.0, None) is None


@pytest.mark.parametrize("goodput", [0.0, -0.5, 1.5, float("nan"), "0.9"])
def test_goodput_outside_0_1_is_one_line_error(goodput):
    with pytest.raises(ConfigError, match=r"`0 < --goodput <= 1` must hold"):
        project(DAY, None, num_gpus=1, goodput=goodput)


def test_range_cell():
    assert range_cell(11.0, (10.6, 11.8), ".1f") == "11.0 (10.6-11.8)"
    assert range_cell(11.0, None, ".1f") == "11.0" and range_cell(None, None, ".1f") == "-"


def test_budget_is_at_risk_where_the_cost_band_crosses_it():
    from echo_tune.plan.projection import budget_note, budget_status

    # the planner flagged a deadline the band crosses, never a budget: 76,368 (75,195-88,167) against 80,000
    assert budget_status(76_368, (75_195, 88_167), 80_000) == "at risk"
    assert budget_status(76_368, (75_195, 78_000), 80_000) == "within"
    assert budget_status(86_000, (81_000, 90_000), 80_000) == "over"
    assert budget_status(82_000, (78_000, 90_000), 80_000) == "over"  # expected over: not "at risk" (as within_budget)
    assert budget_status(76_368, None, 80_000) == "within" and budget_status(None, None, 80_000) is None
    assert budget_status(1.0, (1.0, 2.0), None) is None
    assert budget_note({"budget": "at risk"}) == "budget at risk: the cost band crosses it"
    assert budget_note({"budget": "over"}) == "over budget" and budget_note({"budget": "within"}) is None
