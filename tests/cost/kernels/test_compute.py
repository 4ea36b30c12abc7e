"""Compute-op time: the fused-attention forward and backward efficiencies (cost/kernels/compute.py)."""

from __future__ import annotations

import dataclasses

import pytest

from echo_tune.calibrate.fit.fit_compute import fit_attention
from echo_tune.config.load.loading import load_cluster
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.cost.profile import default_profile, profile_from_dict
from echo_tune.errors import ConfigError
from echo_tune.workload.graph import Op

CLUSTER = load_cluster("h100-sxm")
GPU = CLUSTER.gpu
FLOPS = 2e12
LAUNCH_S = default_profile(CLUSTER).kernel_launch_overhead_s
CAUSAL = default_profile(CLUSTER).attention_causal_factor


def _attention(phase: str, flops: float = FLOPS, causal: bool = False) -> Op:
    return Op(name="echo_tune.flash_attn", kind="attention", phase=phase, region="core_attention",
              flops=flops, bytes=1e6, causal=causal)


def test_backward_attention_runs_at_its_own_efficiency():
    profile = default_profile(CLUSTER)
    peak = GPU.peak_tflops("bf16") * 1e12 * GPU.clock_factor  # the sustained clock under load
    launch = profile.kernel_launch_overhead_s
    fwd, bwd = op_time_s(_attention("fwd"), profile, GPU, "bf16"), op_time_s(_attention("bwd"), profile, GPU, "bf16")
    assert fwd == pytest.approx(FLOPS / (peak * profile.attention_efficiency) + launch)
    assert bwd == pytest.approx(FLOPS / (peak * profile.attention_backward_efficiency) + launch)
    assert profile.attention_backward_efficiency < profile.attention_efficiency  # cuDNN: backward slower per FLOP


def test_profile_without_backward_efficiency_uses_the_forward_one():
    profile = dataclasses.replace(default_profile(CLUSTER), attention_backward_efficiency=None)
    assert op_time_s(_attention("bwd"), profile, GPU, "bf16") == op_time_s(_attention("fwd"), profile, GPU, "bf16")
    data = profile.to_dict()
    assert "attention_backward_efficiency" not in data["compute"]  # old YAML stays as it was
    assert profile_from_dict(data) == profile


def test_backward_efficiency_round_trips_and_is_checked():
    profile = default_profile(CLUSTER)
    data = profile.to_dict()
    assert data["compute"]["attention_backward_efficiency"] == profile.attention_backward_efficiency
    assert profile_from_dict(data) == profile
    data["compute"]["attention_backward_efficiency"] = 1.5
    with pytest.raises(ConfigError, match="attention_backward_efficiency"):
        profile_from_dict(data)


def test_causal_forward_runs_at_the_causal_factor_backward_does_not():
    profile = default_profile(CLUSTER)
    launch = profile.kernel_launch_overhead_s
    plain, masked = (op_time_s(_attention("fwd", causal=c), profile, GPU, "bf16") - launch for c in (False, True))
    assert masked == pytest.approx(plain / profile.attention_causal_factor)
    assert profile.attention_causal_factor < 1
    assert op_time_s(_attention("bwd", causal=True), profile, GPU, "bf16") == \
        op_time_s(_attention("bwd"), profile, GPU, "bf16")


def test_traced_flash_attention_carries_its_mask():
    from echo_tune.config.specs.model import ModelSpec
    from echo_tune.workload.tracer import trace_layer

    model = ModelSpec(name="t", num_layers=1, hidden_size=256, num_attention_heads=4, seq_length=512,
                      vocab_size=1000, attention_backend="flash")
    plain = trace_layer(model, tensor_model_parallel_size=1)
    ring = trace_layer(model, tensor_model_parallel_size=1, context_parallel_size=2)
    kinds = lambda t: [(op.phase, op.causal) for op in t.forward + t.backward if op.kind == "attention"]
    assert kinds(plain) == [("fwd", True), ("bwd", True)]
    # ring attention: the diagonal block is causal, the remote half-blocks are not
    assert sorted(kinds(ring)) == [("bwd", False), ("bwd", True), ("fwd", False), ("fwd", True)]


def _rows(fwd_eff: float, bwd_eff: float | None) -> list[dict]:
    peak = GPU.peak_tflops("bf16") * 1e12  # a bench runs at the boost (peak) clock: fit_compute.py
    rows = []
    for seq in (2048, 4096, 8192):
        flops = 4.0 * 2 * 16 * seq * seq * 128 * 0.5
        for phase, eff, factor in (("fwd", fwd_eff, 1.0), ("bwd", bwd_eff, 2.5)):
            if eff is None:
                continue
            if phase == "fwd":  # the bench's kernels are causal: the forward runs at the causal factor
                eff *= CAUSAL
            rows.append({"dtype": "bf16", "batch": 2, "heads": 16, "seq_len": seq, "head_dim": 128, "phase": phase,
                         "causal": True,
                         "_source": "synthetic", "flops": factor * flops,
                         "time_us": (factor * flops / (peak * eff) + LAUNCH_S) * 1e6})
    return rows


def test_fit_recovers_forward_and_backward_efficiencies():
    fitted, result = fit_attention(_rows(0.62, 0.47), default_profile(CLUSTER), GPU)
    assert fitted.attention_efficiency == pytest.approx(0.62, rel=0.02)
    assert fitted.attention_backward_efficiency == pytest.approx(0.47, rel=0.02)
    assert set(result.params) == {"attention_efficiency", "attention_backward_efficiency"}


def test_fit_of_one_phase_sets_one_efficiency_for_both():
    fitted, _ = fit_attention(_rows(0.58, None), default_profile(CLUSTER), GPU)
    assert fitted.attention_efficiency == pytest.approx(0.58, rel=0.02)
    assert fitted.attention_backward_efficiency is None
    assert fitted.attention_bwd_efficiency == fitted.attention_efficiency
