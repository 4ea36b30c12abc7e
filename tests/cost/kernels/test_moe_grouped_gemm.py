"""The experts' grouped GEMM is timed as TE's GroupedLinear runs it: one GEMM (and one FP8 quantisation) per
local expert, each at its own rows' efficiency (cost/kernels/moe_grouped_gemm.py). Expected values worked by hand from
the datasheet profile: e_max 0.8, FP8 e_max 0.7, x_half 128, launch 4 us, H100 SXM 989 / 1979 TFLOP/s at the
boost clock, times the sustained-clock factor under load (1575 / 1830 MHz, config/presets/gpus.yaml)."""

import pytest

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.cost.kernels.moe_grouped_gemm import is_grouped_expert_gemm, per_expert_op
from echo_tune.cost.profile import profile_for
from echo_tune.sim.schedule.costing import CostContext, phase_cost
from echo_tune.workload.graph import Op

H100 = et.load_cluster("h100-sxm")
PROFILE = profile_for(H100)
CLOCK = 1575 / 1830
assert H100.gpu.clock_factor == pytest.approx(CLOCK)
LAYOUT = check_compatible(et.ModelSpec(name="t", num_layers=2, hidden_size=256, num_attention_heads=4,
                                       seq_length=128, vocab_size=1024), H100, 1, et.ParallelConfig(global_batch_size=1))


def _expert_gemm(groups, rows, n=1536, k=2048, phase="fwd"):
    m = groups * rows
    return Op(name="bmm", kind="gemm", phase=phase, region="moe", subregion="experts", flops=2.0 * m * n * k,
              bytes=2.0 * (m * k + groups * k * n + m * n), gemm_mnk=(m, n, k), gemm_groups=groups)


def _g(x):
    return x / (x + 128)


def test_only_the_experts_bmm_is_grouped_and_each_expert_gets_its_share():
    op = _expert_gemm(16, 64)
    assert is_grouped_expert_gemm(op)
    assert not is_grouped_expert_gemm(_expert_gemm(1, 64))  # one local expert: a plain GEMM
    other = Op(name="bmm", kind="gemm", phase="fwd", region="moe", subregion="router", flops=1.0,
               gemm_mnk=(1024, 8, 8), gemm_groups=16)
    assert not is_grouped_expert_gemm(other)
    one = per_expert_op(op)
    assert one.gemm_mnk == (64, 1536, 2048) and one.flops == op.flops / 16 and one.gemm_groups == 1


@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_bf16_grouped_gemm_is_sixteen_gemms_of_64_rows():
    op = _expert_gemm(16, 64)
    ctx = CostContext(profile=PROFILE, gpu=H100.gpu, precision="bf16", groups=LAYOUT.groups)
    # one expert: 2*64*1536*2048 = 402.65 MFLOP at 989e12 * CLOCK * 0.8 * g(64) g(1536) g(2048) = 2.05 us, but its
    # bytes (its 64 x 2048 input, its 2048 x 1536 weight, its 64 x 1536 output in bf16: 6.76 MB at the
    # profile's 2847.5 GB/s = 2.37 us) bound it: memory-bound, as small-M expert GEMMs are
    hbm = PROFILE.memory_bandwidth_gbyte_s * 1e9
    compute_s = 2.0 * 64 * 1536 * 2048 / (989e12 * CLOCK * 0.8 * _g(64) * _g(1536) * _g(2048))
    memory_s = 2.0 * (64 * 2048 + 2048 * 1536 + 64 * 1536) / hbm
    assert memory_s > compute_s
    one_s = max(compute_s, memory_s) + 4e-6
    assert phase_cost((op,), ctx).compute_s == pytest.approx(16 * one_s, rel=1e-3)
    # folded (one GEMM of m = 1024, one launch) it was memory-bound on the same bytes (108 MB, 38 us) with one
    # launch: 16 launches of 4 us make the grouped GEMM 2.43x as long (102 us against 42 us)
    folded_s = max(op.flops / (989e12 * CLOCK * 0.8 * _g(1024) * _g(1536) * _g(2048)), op.bytes / hbm) + 4e-6
    assert folded_s == pytest.approx(16 * memory_s + 4e-6, rel=1e-9)
    assert 16 * one_s / folded_s == pytest.approx(2.43, abs=0.01)


@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_fp8_grouped_gemm_pays_a_quantisation_per_expert():
    op = _expert_gemm(16, 512)
    ctx = CostContext(profile=PROFILE, gpu=H100.gpu, precision="bf16", groups=LAYOUT.groups, fp8_recipe="tensorwise")
    eff = 0.7 * _g(512) * _g(1536) * _g(2048)
    gemm_s = 2.0 * 512 * 1536 * 2048 / (1979e12 * CLOCK * eff) + 4e-6
    hbm = PROFILE.memory_bandwidth_gbyte_s * 1e9
    # current scaling: amax read + cast to row- and column-wise copies, in three kernels (amax, scale, cast)
    cast_s = 512 * 2048 * 6.0 / hbm + 3 * 4e-6
    assert phase_cost((op,), ctx).compute_s == pytest.approx(16 * (gemm_s + cast_s), rel=1e-3)


@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_delayed_scaling_quantises_all_experts_in_one_kernel_on_hopper():
    # TE v2.10 multi_tensor_quantize_impl: one nvte_multi_cast_transpose for every expert's input under delayed
    # scaling (Float8Quantizer with a transposed copy); the same bytes, one launch instead of 16
    op = _expert_gemm(16, 512)
    delayed = CostContext(profile=PROFILE, gpu=H100.gpu, precision="bf16", groups=LAYOUT.groups, fp8_recipe="delayed")
    cost = phase_cost((op,), delayed)
    eff = 0.7 * _g(512) * _g(1536) * _g(2048)
    gemm_s = 2.0 * 512 * 1536 * 2048 / (1979e12 * CLOCK * eff) + 4e-6
    cast_s = 512 * 2048 * 4.0 / (PROFILE.memory_bandwidth_gbyte_s * 1e9)
    assert cost.compute_s == pytest.approx(16 * (gemm_s + cast_s) + 4e-6, rel=1e-3)
    # on B200 (no transposed copy) TE quantises expert by expert again: 16 cast launches
    b200 = et.load_cluster("b200")
    per_expert = CostContext(profile=profile_for(b200), gpu=b200.gpu, precision="bf16", groups=LAYOUT.groups,
                             fp8_recipe="delayed")
    fused = CostContext(profile=profile_for(b200), gpu=b200.gpu.replace(compute_capability="9.0"), precision="bf16",
                        groups=LAYOUT.groups, fp8_recipe="delayed")
    launches = phase_cost((op,), per_expert).compute_s - phase_cost((op,), fused).compute_s
    one_byte_less = 16 * 512 * 2048 / (profile_for(b200).memory_bandwidth_gbyte_s * 1e9)
    assert launches == pytest.approx(15 * 4e-6 - one_byte_less, rel=1e-3)


def test_the_host_issues_one_cast_for_the_group_under_delayed_scaling():
    # 16 tiny expert GEMMs wait on the host (cost/host/host_bound.py): each issued from Python (TE's GroupedLinear
    # runs expert by expert), their quantisations launched by TE's C++ at the launch's cost: delayed scaling one fused
    # cast, current scaling 16 x 3 quantisation kernels
    from echo_tune.cost.host.host_bound import HOST_LAUNCH_S
    from echo_tune.cost.host.host_time import default_host_time_s

    op = _expert_gemm(16, 512)
    cost = {r: phase_cost((op,), CostContext(profile=PROFILE, gpu=H100.gpu, precision="bf16", groups=LAYOUT.groups,
                                             fp8_recipe=r)).compute_s for r in ("delayed", "tensorwise")}
    assert cost["delayed"] == pytest.approx(16 * default_host_time_s() + HOST_LAUNCH_S, rel=1e-3)
    assert cost["tensorwise"] == pytest.approx(16 * default_host_time_s() + 48 * HOST_LAUNCH_S, rel=1e-3)
