"""sim/memory/memory_band.py: the band's wording follows its rule at each boundary."""

import pytest

from echo_tune.sim.memory.memory_band import BANDS, PEAK_UNDER_PREDICTION, memory_band

GIB = 1 << 30
LIMIT, RESERVE = 78 * GIB, 1 * GIB


def band(peak):
    return memory_band(peak_bytes=peak, reserve_bytes=RESERVE, limit_bytes=LIMIT, stage=3)


def test_over_the_limit_does_not_fit():
    b = band(LIMIT + GIB // 2)
    assert b.band == "does not fit" and b.spare_bytes == -GIB // 2
    assert b.text.startswith("does not fit: stage 3 needs 78.5 GiB, 0.5 GiB over its 78.0 GiB limit (HBM less the")


def test_at_risk_is_inside_the_measured_under_prediction():
    # the largest peak that is not at risk: peak + u (peak - reserve) == limit
    edge = int((LIMIT + PEAK_UNDER_PREDICTION * RESERVE) / (1 + PEAK_UNDER_PREDICTION))
    assert band(edge - 1).band == "fits"
    risky = band(edge + GIB // 8)
    assert risky.band == "at risk" and risky.text.startswith("at risk: peak")
    assert f"{100 * PEAK_UNDER_PREDICTION:.1f}%" in risky.text
    assert band(LIMIT).band == "at risk"  # exactly at the limit: fits as predicted, no margin left


def test_fits_states_its_spare():
    b = band(40 * GIB)
    assert b.band == "fits" and b.spare_bytes == 38 * GIB
    assert b.text == "fits, 38.0 GiB spare: peak 40.0 GiB on stage 3 of 78.0 GiB"


@pytest.mark.parametrize("peak_gib", [1, 30, 70, 72, 75, 77.9, 78, 78.1, 200])
def test_every_band_is_one_of_three_and_agrees_with_fitting(peak_gib):
    b = band(int(peak_gib * GIB))
    assert b.band in BANDS and b.text.startswith(b.band)
    assert (b.band == "does not fit") == (peak_gib * GIB > LIMIT)
