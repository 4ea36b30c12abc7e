"""The accuracy bars of issues 8 and 9 on runs_modern.csv, with the dataset's errata (the settings each
row's source file states). Datasheet profiles, nothing fitted to these rows.

A bar that does not hold after honest modelling is marked ``xfail(strict=True)``, so that a change that
makes one hold fails here and gets its mark removed. The H100 rows of all three sources were predicted
~10-15% too fast (dense MAPE 10.7%); the offset was the clock under load: the presets' sustained clocks
(H100 1,575 of 1,830 MHz at the 700 W limit, sources in presets/gpus.yaml) bring dense MAPE to ~5%, so
that bar now holds, and so does the BF16 MoE bar (Grok-1 rows with the alltoall dispatcher, MAE 13.7% before)."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_tune.validate import validate
from echo_tune.validate.datasets import published_runs

MODERN = published_runs("runs_modern.csv")


@pytest.fixture(scope="module")
def rows():
    rows, _, _ = validate(MODERN)
    return rows


def dense(rows):
    return [r for r in rows if "grok1" not in r.name]


def moe(rows, precision):
    return [r for r in rows if "grok1" in r.name and f"-{precision}-" in r.name]


def mean_abs(rows):
    return sum(abs(r.error_pct) for r in rows) / len(rows)


def test_every_row_simulates_and_fits(rows):
    assert len(rows) == 27
    assert all(r.error is None for r in rows), [(r.name, r.error) for r in rows if r.error]
    assert all(r.fits_memory for r in rows), [r.name for r in rows if not r.fits_memory]


def test_dense_rows_no_row_worse_than_20_percent(rows):
    assert len(dense(rows)) == 20
    assert max(abs(r.error_pct) for r in dense(rows)) <= 20.0


def test_dense_rows_mape_at_most_10_percent(rows):
    assert mean_abs(dense(rows)) <= 10.0


def test_bf16_moe_rows_no_row_worse_than_25_percent(rows):
    assert len(moe(rows, "bf16")) == 4
    assert max(abs(r.error_pct) for r in moe(rows, "bf16")) <= 25.0


def test_bf16_moe_rows_mae_at_most_12_percent(rows):
    assert mean_abs(moe(rows, "bf16")) <= 12.0


def test_fp8_moe_rows_run_their_experts_in_fp8(rows):
    """FP8 Grok-1 rows: faster than the BF16 rows of the same layout, as measured (not 26-29% too slow)."""
    by_name = {r.name: r for r in rows}
    for precision in ("proxy8L-{}-64gpu", "314b-{}-512gpu"):
        bf16, fp8 = (by_name[f"dgxc2411-grok1-{precision.format(p)}"] for p in ("bf16", "fp8"))
        assert fp8.predicted_step_time_s < 0.9 * bf16.predicted_step_time_s
    assert max(abs(r.error_pct) for r in moe(rows, "fp8")) <= 25.0
