"""NVFP4 training (--fp4-format e2m1 --fp4-recipe nvfp4; cost/kernels/fp8.py): the rules, the GEMM rate, the quantisation
kernels and bytes, and memory, each worked by hand (issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.cost.kernels.fp8 import CAST_BYTES_PER_ELEMENT, CAST_KERNELS, fp8_gemm_time_s, group_cast
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.passes import trace_pieces
from echo_tune.workload.graph import Op

LLAMA8 = et.load_model("llama3-8b")
B200 = et.load_cluster("b200")
BF16 = et.ParallelConfig(micro_batch_size=1, global_batch_size=64, use_distributed_optimizer=True)
NVFP4 = BF16.replace(fp4_format="e2m1")


def test_flags_and_rules():
    _, parallel, _, _ = parse_megatron_line("--bf16 --fp4-format e2m1 --fp4-recipe nvfp4")
    assert (parallel["fp4_format"], parallel["fp4_recipe"]) == ("e2m1", "nvfp4")
    assert NVFP4.quantized_recipe == "nvfp4" and not NVFP4.fp8
    with pytest.raises(ConfigError, match="cannot be used simultaneously"):
        NVFP4.replace(fp8_format="hybrid")
    with pytest.raises(ConfigError, match="no fp4 tensor cores"):
        et.simulate(LLAMA8, et.load_cluster("h100-sxm"), 8, NVFP4)


def test_gemm_at_the_fp4_peak_and_the_quantisation_by_hand():
    profile, gpu = profile_for(B200), B200.gpu
    big = Op(name="fc1", kind="gemm", region="mlp", phase="fwd", flops=2 * 16384 * 28672 * 4096,
             bytes=0, gemm_mnk=(16384, 28672, 4096))
    fp8, fp4 = fp8_gemm_time_s(big, profile, gpu, "tensorwise"), fp8_gemm_time_s(big, profile, gpu, "nvfp4")
    launch = profile.kernel_launch_overhead_s
    assert (fp4 - launch) / (fp8 - launch) == pytest.approx(4500 / 9000)  # B200: FP8 4.5, FP4 9 PFLOP/s dense
    # read bf16 for the amaxes (row-wise and of the RHT'd transpose), read it again and write two 4-bit copies
    # with one E4M3 scale per 16 elements: 2 + 2 + 2 x (0.5 + 1/16) = 5.125 B; two kernels
    assert CAST_BYTES_PER_ELEMENT["nvfp4"] == 5.125 and CAST_KERNELS["nvfp4"] == 2
    time_s, kernels = group_cast(big, 4, "nvfp4", profile, gpu)
    assert kernels == 8  # one quantisation per expert, two kernels each
    assert time_s == pytest.approx(4 * 16384 * 4096 * 5.125 / (profile.memory_bandwidth_gbyte_s * 1e9) + 8 * launch)


def test_memory_weights_copies_and_saved_inputs():
    layout = check_compatible(LLAMA8, B200, 8, BF16)
    bf16, fp4 = (et.simulate(LLAMA8, B200, 8, p).stage_memory[0] for p in (BF16, NVFP4))
    from echo_tune.cost.kernels.fp8 import fp8_activation_savings_bytes, fp8_linear_param_count

    layer = trace_pieces(LLAMA8, BF16, layout)["layer"]
    weights = fp8_linear_param_count(layer) * 32 * 2 * (0.5 + 1 / 256)  # two 4-bit copies of every linear weight
    assert fp4.weights_bytes - bf16.weights_bytes == pytest.approx(weights, rel=1e-6)
    saved = fp8_activation_savings_bytes(layer, 1, False) * 32 * (2 - 0.5625)  # inputs kept in 4 bits, not 16
    assert bf16.activations_bytes - fp4.activations_bytes == pytest.approx(saved, rel=1e-6)


def test_nvfp4_is_faster_than_fp8_on_the_same_gpu_but_not_twice():
    fp8 = et.simulate(LLAMA8, B200, 8, BF16.replace(fp8_format="hybrid", fp8_recipe="tensorwise"))
    fp4 = et.simulate(LLAMA8, B200, 8, NVFP4)
    assert 1.0 < fp8.step_time_s / fp4.step_time_s < 2.0
    assert any(n.startswith("nvfp4:") for n in fp4.notes)
