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
# Predicted out of memory, with the reason (see docs/bridge_runs.md): the row's table micro-batch size
# over its recipe preset's, on a schedule that keeps every micro-batch of a stage in flight.
OVER_MEMORY = {
    "mb2511-gpt-oss-120b-bf16-64xh100": "table MBS 4 (recipe preset MBS 1): ~1.6 GiB per MoE layer and "
                                        "micro-batch x 36 in flight on stage 0 of PP4 1F1B (94 GiB)",
}


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


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=OVER_MEMORY[n]))
                                  if n in OVER_MEMORY else n for n in ROWS])
def test_rows_fit_in_memory(results, name):
    assert results[name].fits_memory
