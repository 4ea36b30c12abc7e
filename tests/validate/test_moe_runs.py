"""The BF16 MoE rows of runs_modern.csv (Grok-1 314B and its proxies on H100, dgxc-benchmarking v24.11.1):
all simulate as MoE with the settings their source file states (errata: alltoall dispatcher, capacity 1.0
padded, no dropout, no biases, bf16 gradient reduction), none refused, none predicted out of memory.
Datasheet profile, nothing fitted to these rows. The accuracy bars themselves: test_bars.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from echo_tune.validate import read_runs
from echo_tune.validate.datasets import published_runs

MODERN = published_runs("runs_modern.csv")


def test_grok_rows_read_as_moe_with_their_sources_settings():
    grok = [c for c in read_runs(MODERN) if "grok1" in c.name]
    assert len(grok) == 7 and all(c.error is None for c in grok)
    for case in grok:
        m = case.model
        assert m.is_moe and m.num_experts == 8 and m.moe_router_topk == 2
        assert m.moe_token_dispatcher_type == "alltoall" and not m.moe_grouped_gemm
        assert m.moe_expert_capacity_factor == 1.0 and m.moe_pad_expert_input_to_capacity
        assert m.hidden_dropout == 0.0 and not m.add_bias_linear and case.parallel.grad_reduce_in_bf16
