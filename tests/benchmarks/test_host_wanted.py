"""benchmarks/host_wanted.py: the host time per kernel each published MoE run asks for."""

import pytest
import host_wanted
from echo_tune.validate.datasets import published_runs
from echo_tune.validate.runs import read_runs


def _case(dataset: str, name: str):
    return next(c for c in read_runs(published_runs(dataset)) if c.name == name)


def test_a_host_bound_row_is_met_at_the_value_it_asks_for():
    # Qwen3-30B-A3B dropless on 8 B200 (MBS 1, only router and preprocess in graphs): host-bound, so it moves with
    # the host time per kernel and is met (within the bisection's precision) at the value found
    case = _case("runs_bridge_2025.csv", "mb2511-qwen3-30b-a3b-mxfp8-8xb200")
    want = host_wanted.wanted_s(case)
    assert want is not None and host_wanted.RANGE_S[0] < want < host_wanted.RANGE_S[1]
    assert host_wanted.error_at(case, want) == pytest.approx(0.0, abs=0.005)
    assert host_wanted.error_at(case, 0.8 * want) < 0.0 < host_wanted.error_at(case, 1.2 * want)


def test_a_row_graphed_whole_asks_for_nothing_it_can_be_met_at():
    # Qwen3-30B-A3B drop-and-pad on 8 B200: whole layers replay from CUDA graphs, one launch per graph, so no host
    # time per kernel in range changes it enough to meet it (predicted a little fast at any value)
    case = _case("runs_bridge_2025.csv", "mb2509-qwen3-30b-a3b-fp8-tokendrop-8xb200")
    assert host_wanted.wanted_s(case) is None
    assert abs(host_wanted.error_at(case, 85e-6) - host_wanted.error_at(case, 65e-6)) < 0.01


def test_the_summary_counts_only_rows_that_move():
    rows = [{"host": "h", "model": "m", "wanted_us": 50.0, "moves_pct": 20.0},
            {"host": "h", "model": "m", "wanted_us": 70.0, "moves_pct": -3.0},
            {"host": "h", "model": "m", "wanted_us": 300.0, "moves_pct": 0.2},  # does not measure the host
            {"host": "h", "model": "m", "wanted_us": None, "moves_pct": 20.0}]
    (only,) = host_wanted.summary(rows)
    assert only["rows"] == 2 and only["median_wanted_us"] == 60.0 and only["range_us"] == (50.0, 70.0)
