"""cost/kernels/gemm_benchmarks.py: a datasheet profile's GEMM efficiencies from public kernel benchmarks."""

import pytest

import echo_tune as et
from echo_tune.cost.kernels import gemm_benchmarks
from echo_tune.cost.datasheet_efficiencies import DATASHEET_FP8_GEMM_EFFICIENCY, DATASHEET_GEMM_EFFICIENCY
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError


def _g(*dims, half=128.0):
    out = 1.0
    for d in dims:
        out *= d / (d + half)
    return out


def test_b200_takes_its_benchmarked_rates_over_its_datasheet_peaks():
    profile = profile_for(et.load_cluster("b200"))
    # vLLM PR 19566, 16384 x 6144 x 4096: bf16 1512.8, FP8 2544.7 TFLOP/s; pytorch/ao PR 2427 bf16 cubes 4096 / 6144 /
    # 8192: 1410 / 1450 / 1420; B200 dense peaks 2250 / 4500
    bf16 = [1512.8 / _g(16384, 6144, 4096), 1410 / _g(4096, 4096, 4096), 1450 / _g(6144, 6144, 6144),
            1420 / _g(8192, 8192, 8192)]
    assert profile.gemm_max_efficiency == pytest.approx(sum(bf16) / 4 / 2250)
    assert profile.fp8_gemm_max_efficiency == pytest.approx(2544.7 / (4500 * _g(16384, 6144, 4096)))
    assert 0.68 < profile.gemm_max_efficiency < 0.69 and 0.59 < profile.fp8_gemm_max_efficiency < 0.61
    assert "from public kernel benchmarks" in profile.label


def test_gb200_and_gb300_carry_b200s_efficiencies_not_its_rates():
    b200 = profile_for(et.load_cluster("b200"))
    for name in ("gb200-nvl72", "gb300-nvl72"):
        profile = profile_for(et.load_cluster(name))
        assert profile.gemm_max_efficiency == pytest.approx(b200.gemm_max_efficiency)
        assert profile.fp8_gemm_max_efficiency == pytest.approx(b200.fp8_gemm_max_efficiency)
        assert "of b200, applied to" in profile.label


def test_gpus_without_benchmarks_keep_the_defaults():
    for name in ("h100-sxm", "a100-80gb", "h200-sxm"):
        profile = profile_for(et.load_cluster(name))
        assert (profile.gemm_max_efficiency, profile.fp8_gemm_max_efficiency) == \
            (DATASHEET_GEMM_EFFICIENCY, DATASHEET_FP8_GEMM_EFFICIENCY)
        assert "kernel benchmarks" not in profile.label


def test_a_rate_above_the_peak_is_refused(monkeypatch):
    row = {"tflops": 5000.0, "m": 8192, "n": 8192, "k": 8192, "source": "x"}
    monkeypatch.setattr(gemm_benchmarks, "_table", lambda: {"b200": {"fp8": [row]}})
    with pytest.raises(ConfigError, match=r"`0 < fp8_gemm_max_efficiency <= 1` must hold for b200 fp8"):
        gemm_benchmarks.benchmark_efficiencies(et.load_cluster("b200").gpu, 128.0)
