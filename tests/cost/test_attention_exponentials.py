"""The softmax's exponentials in fused attention, bound by the special-function units (issue 39 item 6: Blackwell
Ultra doubles them). Rates from the CUDA programming guide's throughput table (16 exp2 per clock and SM) and NVIDIA's
Blackwell Ultra blog (32 per clock and SM on compute capability 10.3)."""

import pytest

import echo_tune as et
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.cost.profile import profile_for
from echo_tune.workload.graph import Op
from echo_tune.workload.recording.kernels import flash_forward_flops, flash_scores

B200, GB300 = et.load_cluster("b200"), et.load_cluster("gb300-nvl72")


def test_rates_by_hand():
    assert B200.gpu.ex2_per_s == pytest.approx(148 * 16 * 1580e6)  # at the sustained clock
    assert GB300.gpu.ex2_per_s == pytest.approx(160 * 32 * 1834e6)
    assert et.load_cluster("h100-sxm").gpu.ex2_per_s == pytest.approx(132 * 16 * 1575e6)


def _attention(head_dim: int) -> Op:
    q = (8192, 1, 64, head_dim)  # s, b, heads, d
    flops, exps = flash_forward_flops(q, q, True), flash_scores(q, q, True)
    return Op(name="flash", kind="attention", phase="fwd", region="core_attention", flops=flops, exps=exps,
              causal=True)


def test_small_heads_wait_on_the_exponentials_on_blackwell_but_not_on_blackwell_ultra():
    """Head dim 64: 256 tensor-core FLOPs per score against one exponential. B200 runs the causal forward's FLOPs at
    2,250 TFLOP/s x 0.61 (attention) x 0.85 (causal) x 0.85 (clock) = 995 TFLOP/s, 0.26 ns per score, and the
    exponentials at 3.74 T/s, 0.27 ns: SFU-bound, just.
    GB300's 9.4 T/s (0.11 ns) leave its tensor cores the bound. Head dim 128 (512 FLOPs) is tensor-core bound on both."""
    for gpu_cluster, bound in ((B200, "sfu"), (GB300, "mma")):
        profile, gpu = profile_for(gpu_cluster), gpu_cluster.gpu
        op = _attention(64)
        t = op_time_s(op, profile, gpu, "bf16") - profile.kernel_launch_overhead_s
        sfu = op.exps / gpu.ex2_per_s
        mma = op.flops / (gpu.peak_tflops("bf16") * 1e12 * gpu.clock_factor * profile.attention_efficiency
                          * profile.attention_causal_factor)
        assert t == pytest.approx(max(sfu, mma)) and (sfu > mma) == (bound == "sfu")
        wide = _attention(128)
        t128 = op_time_s(wide, profile, gpu, "bf16") - profile.kernel_launch_overhead_s
        assert wide.exps / gpu.ex2_per_s < t128  # the exponentials hide behind the MMAs
