"""GB300's sustained clock from its power limit (config/presets/gpus.yaml, GB300 notes): the clock under load follows
the power each SM may draw, with the exponent NVIDIA's two ratings of the same Blackwell die give (B200 at 1,000 W,
GB200 at 1,200 W), from B200's measured clock. Compute-bound kernels gain by the SM count times that clock; memory-bound kernels do not."""

import math

import pytest

from echo_tune.config.load.loading import load_cluster, load_gpu
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.cost.profile import profile_for
from echo_tune.workload.graph import Op
from echo_tune.workload.recording.kernels import flash_forward_flops, flash_scores

# Board power: HGX B200 datasheet 1,000 W; GB200 1,200 W and GB300 1,400 W (Verda's GB300 NVL72 note, Lockwood's
# B300 notes; sources in config/presets/gpus.yaml).
B200_W, GB200_W, GB300_W = 1000.0, 1200.0, 1400.0
GEMM = Op(name="fc1", kind="gemm", phase="fwd", region="mlp", flops=2 * 16384**3, bytes=3 * 2 * 16384**2,
          gemm_mnk=(16384, 16384, 16384))
NORM = Op(name="norm", kind="memory", phase="fwd", region="mlp", flops=0.0, bytes=8e9)


def test_exponent_from_two_ratings_of_one_die_lies_inside_the_cmos_range():
    b200, gb200 = load_gpu("b200"), load_gpu("gb200")
    assert b200.sm_count == gb200.sm_count  # the same die: only the power limit differs
    a = math.log(gb200.peak_bf16_tflops / b200.peak_bf16_tflops) / math.log(GB200_W / B200_W)
    assert a == pytest.approx(0.578, abs=0.001)
    assert 1 / 3 < a < 1  # P = C V^2 f: f ~ P^(1/3) with voltage rising with the clock, f ~ P at fixed voltage
    # GB200's clock is not this law's (1,755 MHz): its training pairs with B200 put it lower
    # (benchmarks/gb200_clock_pairs.py, tests/benchmarks/test_gb200_clock_pairs.py)
    assert gb200.sustained_clock_mhz < b200.sustained_clock_mhz * (GB200_W / B200_W) ** a - 100


def test_gb300_clock_is_b200s_scaled_by_power_per_sm():
    b200, gb200, gb300 = load_gpu("b200"), load_gpu("gb200"), load_gpu("gb300")
    a = math.log(gb200.peak_bf16_tflops / b200.peak_bf16_tflops) / math.log(GB200_W / B200_W)
    per_sm = (GB300_W / gb300.sm_count) / (B200_W / b200.sm_count)
    assert per_sm == pytest.approx(1.295, abs=0.001)
    assert gb300.sustained_clock_mhz == pytest.approx(b200.sustained_clock_mhz * per_sm ** a, abs=1)
    # at most the clock NVIDIA's exp2 micro-benchmark shows unthrottled: 10,024 Gop/s / (160 SMs x 32 per clock)
    assert gb300.sustained_clock_mhz < 10_024e9 / (160 * 32) / 1e6
    assert gb300.clock_factor <= 1.0


def _ratio(op: Op, precision: str = "bf16") -> float:
    """GB300's time over GB200's for one op, launch overhead left out."""
    times = []
    for name in ("gb300-nvl72", "gb200-nvl72"):
        cluster = load_cluster(name)
        profile = profile_for(cluster)
        times.append(op_time_s(op, profile, cluster.gpu, precision) - profile.kernel_launch_overhead_s)
    return times[0] / times[1]


def test_gemm_bound_layer_faster_by_sm_count_times_clock_memory_bound_unchanged():
    gb200, gb300 = load_gpu("gb200"), load_gpu("gb300")
    expected = (gb200.sm_count * gb200.sustained_clock_mhz) / (gb300.sm_count * gb300.sustained_clock_mhz)
    assert expected == pytest.approx(1 / 1.224, abs=0.002)
    # same datasheet peak on both (peak clocks rounded to the MHz), so the sustained tensor-core rate decides
    assert _ratio(GEMM) == pytest.approx(gb200.clock_factor / gb300.clock_factor)
    assert _ratio(GEMM) == pytest.approx(expected, rel=0.001)
    assert _ratio(NORM) == pytest.approx(1.0)  # 8 TB/s HBM3e on both


def test_attention_gains_the_clock_and_short_heads_the_doubled_sfu():
    """Head dim 128: tensor-core bound on both, GB300 faster by the clock alone. Head dim 64 waits on the SFUs on
    GB200 (16 exp2 per clock and SM) and not on GB300 (32): it gains more than the clock."""
    def attention(head_dim):
        q = (8192, 1, 64, head_dim)
        return Op(name="flash", kind="attention", phase="fwd", region="core_attention",
                  flops=flash_forward_flops(q, q, True), exps=flash_scores(q, q, True), causal=True)
    gemm = _ratio(GEMM)
    assert _ratio(attention(128)) == pytest.approx(gemm, rel=1e-6)
    assert _ratio(attention(64)) < gemm
