"""runs_bridge.csv (Megatron-Bridge 25.09 / 25.11 performance recipes): every row simulates with the settings it
states (moe_act recompute, YaRN, bf16 main grads, MLA + DeepEP + pipeline layout + MTP, CUDA graphs with the TE
RNG tracker), none refused; the rows that fit on their GPUs are predicted to fit. Datasheet profile, nothing
fitted to these rows."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_tune.validate import read_runs, simulate_case
from echo_tune.validate.datasets import published_runs

BRIDGE = published_runs("runs_bridge.csv")


@pytest.fixture(scope="module")
def results():
    return {r.name: r for r in (simulate_case(c) for c in read_runs(BRIDGE))}


def test_all_six_rows_simulate(results):
    assert len(results) == 6
    assert {name: r.error for name, r in results.items() if r.error} == {}
    assert all(r.predicted_step_time_s > 0 for r in results.values())


ROWS = ("mb2511-qwen3-30b-a3b-fp8cs-16xh100", "mb2511-qwen3-235b-a22b-fp8cs-256xh100",
        "mb2511-gpt-oss-120b-bf16-64xh100", "mb2509-deepseek-v3-fp8-1024xh100", "mb2511-llama3-8b-fp8cs-8xb200",
        "mb2511-llama31-405b-fp8cs-128xb200")


@pytest.mark.parametrize("name", ROWS)
def test_rows_fit_in_memory(results, name):
    assert results[name].fits_memory


def test_gpt_oss_row_is_corrected_to_its_recipe_micro_batch(results):
    """The table's MBS 4 / GA 2 cannot hold at DP 16 with GBS 512 (errata/runs_bridge.yaml): the recipe's MBS 1
    is applied, said so, and without errata the row as written is predicted out of memory."""
    row = results["mb2511-gpt-oss-120b-bf16-64xh100"]
    assert any("corrects micro_batch_size" in e for e in row.errata)
    raw = {c.name: c for c in read_runs(BRIDGE, errata=False)}["mb2511-gpt-oss-120b-bf16-64xh100"]
    assert raw.parallel.micro_batch_size == 4
    assert not simulate_case(raw).fits_memory
