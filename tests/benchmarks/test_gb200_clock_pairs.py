"""benchmarks/gb200_clock_pairs.py: GB200's sustained clock from the runs it shares with B200."""

import gb200_clock_pairs
import pytest


@pytest.fixture(scope="module")
def out():
    return gb200_clock_pairs.measure(clocks_mhz=(1580, 1620, 1660, 1755))


def test_measured_ratios_by_hand(out):
    # runs_bridge.csv, Megatron-Bridge 25.09 Llama3-8B FP8 on 8 GPUs: 4.18 s (GB200) against 4.3699 s (B200)
    assert out["measured"]["mb2509-llama3-8b-fp8-8xgb200"] == pytest.approx(4.18 / 4.3699, rel=1e-4)
    assert all(0.95 < v < 1.0 for v in out["measured"].values())  # GB200 1.009-1.045x faster


def test_the_preset_clock_reproduces_the_pairs(out):
    preset = out["preset"]
    assert preset["mean"] == pytest.approx(1.0, abs=0.01)
    assert all(abs(v - 1) < 0.025 for v in preset["pairs"].values())
    assert abs(out["matched_clock_mhz"] - preset["clock_mhz"]) <= 10


def test_the_datasheet_ratio_made_gb200_too_fast(out):
    # B200's sustained / peak ratio at GB200's peak clock (1,755 MHz): every pair simulated 5-8% faster than measured
    by_clock = {row["clock_mhz"]: row for row in out["table"]}
    assert all(v < 0.96 for v in by_clock[1755]["pairs"].values())
    assert by_clock[1580]["mean"] > 1 > by_clock[1660]["mean"]
