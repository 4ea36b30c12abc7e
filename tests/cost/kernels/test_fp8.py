"""FP8 (cost/kernels/fp8.py): which GEMMs, their speed, the recipes' kernels, memory, the rules, B200 presets."""

import pytest

import echo_tune as et
from echo_tune.config import check_compatible
from echo_tune.cost.kernels.fp8 import CAST_BYTES_PER_ELEMENT, TP_OVERLAP_REGIONS, is_fp8_gemm
from echo_tune.errors import ConfigError
from echo_tune.workload import trace_layer

LLAMA8 = et.load_model("llama3-8b")
GPT3 = et.load_model("gpt3-175b")
H100 = et.load_cluster("h100-sxm")
BF16 = et.ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, micro_batch_size=1,
                         global_batch_size=64, use_distributed_optimizer=True)
FP8 = BF16.replace(fp8_format="hybrid")


def test_only_linear_layers_run_in_fp8():
    layer = trace_layer(LLAMA8, tensor_model_parallel_size=2, context_parallel_size=1, sequence_parallel=True,
                        micro_batch_size=1, precision="bf16")
    fp8 = [op for op in layer.forward + layer.backward if is_fp8_gemm(op)]
    assert len(fp8) == 12  # qkv, proj, fc1, fc2: forward + dgrad + wgrad
    assert {op.region for op in fp8} == set(TP_OVERLAP_REGIONS)  # the dense layer: its 4 TE linears
    assert not any(is_fp8_gemm(op) for op in layer.forward if op.region == "core_attention")


def test_fp8_is_faster_but_not_twice_as_fast():
    bf16, fp8 = (et.simulate(LLAMA8, H100, 8, p) for p in (BF16, FP8))
    ratio = bf16.step_time_s / fp8.step_time_s
    assert 1.1 < ratio < 2.0  # GEMMs at most 2x faster; attention, norms, casts are not
    assert fp8.breakdown_s["compute"] < bf16.breakdown_s["compute"]


def test_current_scaling_costs_more_than_delayed():
    delayed = et.simulate(LLAMA8, H100, 8, FP8)
    tensorwise = et.simulate(LLAMA8, H100, 8, FP8.replace(fp8_recipe="tensorwise"))
    assert CAST_BYTES_PER_ELEMENT["tensorwise"] > CAST_BYTES_PER_ELEMENT["delayed"]
    assert tensorwise.step_time_s > delayed.step_time_s


def test_fp8_memory_weight_copies_and_fp8_saved_inputs():
    bf16, fp8 = (et.simulate(LLAMA8, H100, 8, p).stage_memory[0] for p in (BF16, FP8))
    gather = et.simulate(LLAMA8, H100, 8, FP8.replace(fp8_param_gather=True)).stage_memory[0]
    assert fp8.activations_bytes < bf16.activations_bytes
    assert fp8.weights_bytes > bf16.weights_bytes  # TE's cached FP8 copies next to the bf16 weights
    assert gather.weights_bytes == bf16.weights_bytes  # FP8 primary weights replace the bf16 ones


@pytest.mark.parametrize("cluster, changes, fragment", [
    ("a100-80gb", {}, "has no fp8 tensor cores"),
    ("h100-sxm", {"fp8_recipe": "mxfp8"}, "needs Blackwell"),
    ("h100-sxm", {"fp8_param_gather": True, "use_distributed_optimizer": False}, "needs `use_distributed_optimizer`"),
    ("h100-sxm", {"first_last_layers_bf16": True}, "not supported with `fp8_recipe == 'delayed'`"),
    ("h100-sxm", {"fp8_recipe": "tensorwise", "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 40},
     "num_layers_at_start_in_bf16 <= num_layers / pipeline_model_parallel_size"),
])
def test_fp8_rules(cluster, changes, fragment):
    with pytest.raises(ConfigError, match=None) as err:
        check_compatible(LLAMA8, et.load_cluster(cluster), 8, FP8.replace(**changes))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_fp8_flags_need_fp8_format():
    with pytest.raises(ConfigError, match="need `fp8_format`"):
        check_compatible(LLAMA8, H100, 8, BF16.replace(fp8_param_gather=True))


def test_gpt3_fp8_simulates_on_b200_and_beats_h100():
    parallel = et.ParallelConfig(tensor_model_parallel_size=4, pipeline_model_parallel_size=8, sequence_parallel=True,
                                 virtual_pipeline_model_parallel_size=3, global_batch_size=256,
                                 use_distributed_optimizer=True, fp8_format="hybrid", fp8_param_gather=True)
    b200 = et.simulate(GPT3, et.load_cluster("b200"), 128, parallel)
    h100 = et.simulate(GPT3, H100, 128, parallel)
    assert b200.fits_memory and b200.step_time_s < h100.step_time_s


def test_presets_aliases_and_peaks():
    assert et.load_cluster("h100").name == "h100-sxm" and et.load_cluster("gb200").name == "gb200-nvl72"
    gb300 = et.load_cluster("gb300")
    assert gb300.name == "gb300-nvl72" and gb300.nvlink_domain_size == 72 and gb300.nic_bandwidth_gbit_s == 800
    assert gb300.gpu.peak_fp8_tflops == 2 * gb300.gpu.peak_bf16_tflops and gb300.gpu.peak_fp4_tflops == 15000
    b200 = et.load_cluster("b200").gpu
    assert b200.peak_fp8_tflops == 2 * b200.peak_bf16_tflops and b200.peak_fp4_tflops == 2 * b200.peak_fp8_tflops
    assert H100.gpu.peak_tflops("fp8") == 1979
    with pytest.raises(ConfigError, match="no fp8 tensor cores"):
        et.load_cluster("a100-80gb").gpu.peak_tflops("fp8")


def test_nvl72_domain_keeps_large_groups_on_nvlink():
    nvl72 = et.load_cluster("gb200-nvl72")
    parallel = et.ParallelConfig(tensor_model_parallel_size=4, pipeline_model_parallel_size=2, context_parallel_size=2,
                                 global_batch_size=72)
    nvl = check_compatible(LLAMA8, nvl72, 144, parallel)
    trays = check_compatible(LLAMA8, nvl72.replace(nvlink_domain_size=None), 144, parallel)
    assert not nvl.groups["cp"].crosses_nodes and trays.groups["cp"].crosses_nodes  # CP at stride 4: other tray
    assert not nvl.groups["dp"].crosses_nodes and nvl.groups["pp"].crosses_nodes  # one rack per stage
    with pytest.raises(ConfigError, match="nvlink_domain_size % gpus_per_node == 0"):
        nvl72.replace(nvlink_domain_size=70)


def test_first_last_layers_in_bf16_cost_bf16_time():
    tensorwise = FP8.replace(fp8_recipe="tensorwise")
    fp8 = et.simulate(LLAMA8, H100, 8, tensorwise)
    some = et.simulate(LLAMA8, H100, 8, tensorwise.replace(first_last_layers_bf16=True))
    more = et.simulate(LLAMA8, H100, 8, tensorwise.replace(first_last_layers_bf16=True, num_layers_at_start_in_bf16=4,
                                                            num_layers_at_end_in_bf16=4))
    assert fp8.step_time_s < some.step_time_s < more.step_time_s


def test_delayed_scaling_pays_an_amax_all_reduce_per_pass_that_grows_with_the_group():
    from echo_tune.cost.kernels.fp8 import amax_reduction_s
    from echo_tune.cost.profile import default_profile

    parallel = FP8.replace(tensor_model_parallel_size=4, global_batch_size=512)
    small, large = (check_compatible(LLAMA8, H100, n, parallel) for n in (8, 512))
    profile = default_profile(H100)
    assert 0 < amax_reduction_s(small, H100, profile, 32) < amax_reduction_s(large, H100, profile, 32)
    delayed = et.simulate(LLAMA8, H100, 512, parallel)
    blockwise = et.simulate(LLAMA8, H100, 512, parallel.replace(fp8_recipe="blockwise"))
    assert delayed.breakdown_s["tp_cp_comm"] > blockwise.breakdown_s["tp_cp_comm"]  # no amax all-reduce


def test_current_scaling_quantises_in_three_kernels():
    """TE's Float8CurrentScalingQuantizer: amax kernel, scale kernel, cast kernel (delayed: the cast alone).
    A 4096 x 4096 forward input: tensorwise moves 6 B / element against delayed's 4, and two more launches."""
    from echo_tune.cost.kernels.fp8 import CAST_KERNELS, group_cast
    from echo_tune.cost.profile import profile_for
    from echo_tune.workload.graph import Op

    import echo_tune as et

    profile = profile_for(et.load_cluster("h100-sxm"))
    op = Op(name="mm", kind="gemm", phase="fwd", region="mlp", flops=2.0 * 4096 ** 3, gemm_mnk=(4096, 4096, 4096))
    hbm = profile.memory_bandwidth_gbyte_s * 1e9
    assert CAST_KERNELS == {"delayed": 1, "tensorwise": 3, "blockwise": 1, "mxfp8": 1, "nvfp4": 2}
    cast_s = lambda recipe: group_cast(op, 1, recipe, profile, None)[0]  # noqa: E731 (one linear layer's)
    assert cast_s("tensorwise") - cast_s("delayed") == pytest.approx(
        4096 * 4096 * 2.0 / hbm + 2 * 4e-6)


def test_mxfp8_reports_say_what_the_one_public_comparison_measured():
    # Megatron-Bridge 25.11, DGX-B200, the same recipe: MXFP8 3.7% / 5.9% slower than FP8 current scaling
    from echo_tune.cost.kernels.fp8 import MXFP8_MEASURED_OVER_CS
    from echo_tune.validate.datasets import published_runs
    from echo_tune.validate.runs import read_runs

    assert all(r > 1 for r in MXFP8_MEASURED_OVER_CS.values())
    row = next(c for c in read_runs(published_runs("runs_bridge.csv")) if c.name == "mb2511-llama3-8b-fp8cs-8xb200")
    cs = et.simulate(row.model, row.cluster, row.num_gpus, row.parallel)
    mx = et.simulate(row.model, row.cluster, row.num_gpus, row.parallel.replace(fp8_recipe="mxfp8"))
    # the note's claim: this model puts MXFP8 ~1% shorter; once it models what makes it slower, update the note
    assert 0.98 < mx.step_time_s / cs.step_time_s < 1.0
    assert any(n.startswith("mxfp8:") and "3.7%" in n and "5.9%" in n for n in mx.notes)
    assert not any(n.startswith("mxfp8:") for n in cs.notes)


def test_blackwell_per_tensor_casts_write_no_transposed_copy():
    """TE v2.10 quantizer.cpp: with_transpose = columnwise_usage && !nvte_is_non_tn_fp8_gemm_supported(): from
    compute capability 10.0 a per-tensor quantisation writes the row-wise copy alone (1 B per element less);
    block-scaled recipes keep both copies."""
    from echo_tune.cost.kernels.fp8 import cast_bytes_per_element, group_cast
    from echo_tune.cost.profile import profile_for
    from echo_tune.workload.graph import Op

    import echo_tune as et

    h100, b200 = et.load_cluster("h100-sxm").gpu, et.load_cluster("b200").gpu
    assert (h100.fp8_any_layout, b200.fp8_any_layout) == (False, True)
    for recipe in ("delayed", "tensorwise"):
        assert cast_bytes_per_element(recipe, h100) - cast_bytes_per_element(recipe, b200) == 1.0
    for recipe in ("blockwise", "mxfp8"):
        assert cast_bytes_per_element(recipe, h100) == cast_bytes_per_element(recipe, b200)
    profile = profile_for(et.load_cluster("h100-sxm"))
    op = Op(name="mm", kind="gemm", phase="fwd", region="mlp", flops=2.0 * 4096 ** 3, gemm_mnk=(4096, 4096, 4096))
    one_byte_less = group_cast(op, 1, "delayed", profile, h100)[0] - group_cast(op, 1, "delayed", profile, b200)[0]
    assert one_byte_less == pytest.approx(4096 * 4096 / (profile.memory_bandwidth_gbyte_s * 1e9))


@pytest.mark.parametrize("cc,any_layout", [("9.0", False), ("10.0", True), ("10.3", True), ("12.0", False),
                                           ("13.0", True), (None, False)])
def test_non_tn_fp8_gemms_follow_tes_rule(cc, any_layout):
    import echo_tune as et

    assert et.load_cluster("h100-sxm").gpu.replace(compute_capability=cc).fp8_any_layout is any_layout


def test_a_malformed_compute_capability_is_refused():
    from echo_tune.config.load.loading import load_gpu
    from echo_tune.errors import ConfigError

    with pytest.raises(ConfigError, match=r'`compute_capability` must be "major.minor"'):
        load_gpu({"name": "x", "peak_bf16_tflops": 1, "peak_fp16_tflops": 1, "peak_fp32_tflops": 1,
                  "memory_bytes": 1, "memory_bandwidth_gbyte_s": 1, "compute_capability": "sm90"})


def test_an_unquoted_compute_capability_is_refused_with_the_quoted_fix():
    from echo_tune.config.load.loading import load_gpu
    from echo_tune.errors import ConfigError

    with pytest.raises(ConfigError, match=r'must be text, but got \(compute_capability=9.0\); quote it: '
                                          r'compute_capability: "9.0"'):
        load_gpu({"name": "x", "peak_bf16_tflops": 1, "peak_fp16_tflops": 1, "peak_fp32_tflops": 1,
                  "memory_bytes": 1, "memory_bandwidth_gbyte_s": 1, "compute_capability": 9.0})
