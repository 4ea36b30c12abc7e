"""Clocks under load: compute-bound kernel time scales with sustained / peak SM clock, memory-bound does not."""

from __future__ import annotations

import pytest

from echo_tune.config.load.loading import cluster_from_dict, load_cluster, load_gpu
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.cost.profile import default_profile
from echo_tune.errors import ConfigError
from echo_tune.workload.graph import Op

GEMM = Op(name="fc1", kind="gemm", phase="fwd", region="mlp", flops=2 * 8192**3, bytes=3 * 2 * 8192**2,
          gemm_mnk=(8192, 8192, 8192))
COPY = Op(name="add", kind="memory", phase="fwd", region="mlp", flops=0.0, bytes=4e9)


def test_presets_state_peak_clock_consistent_with_peak_tflops():
    # peak TFLOP/s = SMs x dense FLOPs per clock per SM x peak clock (A100 2,048, Hopper 4,096, Blackwell 8,192)
    for name, per_sm in (("a100-80gb", 2048), ("h100-sxm", 4096), ("h200-sxm", 4096), ("b200", 8192),
                         ("gb200", 8192), ("gb300", 8192)):
        gpu = load_gpu(name)
        assert gpu.sm_count * per_sm * gpu.peak_clock_mhz * 1e6 / 1e12 == pytest.approx(gpu.peak_bf16_tflops,
                                                                                         rel=0.003)
        assert gpu.clock_factor <= 1.0


def test_compute_bound_time_scales_with_clock_memory_bound_does_not():
    cluster = load_cluster("h100-sxm")
    profile = default_profile(cluster)
    boost = cluster.gpu.replace(sustained_clock_mhz=cluster.gpu.peak_clock_mhz)
    slow = cluster.gpu.replace(sustained_clock_mhz=cluster.gpu.peak_clock_mhz / 2)
    launch = profile.kernel_launch_overhead_s
    fast_s, slow_s = (op_time_s(GEMM, profile, g, "bf16") - launch for g in (boost, slow))
    assert slow_s == pytest.approx(2 * fast_s)
    assert op_time_s(COPY, profile, slow, "bf16") == op_time_s(COPY, profile, boost, "bf16")


def test_cluster_key_overrides_preset_and_is_checked():
    data = {"gpu": "h100-sxm", "gpus_per_node": 8, "intra_node_bandwidth_gbyte_s": 450, "nics_per_node": 8,
            "nic_bandwidth_gbit_s": 400}
    cluster = cluster_from_dict({**data, "sustained_clock_mhz": 1400}, name="c")
    assert cluster.sustained_clock_mhz == 1400
    with pytest.raises(ConfigError, match="sustained_clock_mhz"):
        cluster_from_dict({**data, "sustained_clock_mhz": -5}, name="c")
    with pytest.raises(ConfigError, match="peak_clock_mhz"):
        load_gpu({"name": "x", "peak_bf16_tflops": 1, "peak_fp16_tflops": 1, "peak_fp32_tflops": 1,
                  "memory_bytes": 1, "memory_bandwidth_gbyte_s": 1, "sustained_clock_mhz": 1000})
    with pytest.raises(ConfigError, match="sustained_clock_derived_from.*sustained_clock_mhz=None"):
        load_gpu({"name": "x", "peak_bf16_tflops": 1, "peak_fp16_tflops": 1, "peak_fp32_tflops": 1, "memory_bytes": 1,
                  "memory_bandwidth_gbyte_s": 1, "peak_clock_mhz": 1800, "sustained_clock_derived_from": "a guess"})


def test_simulate_uses_cluster_clock_over_preset():
    from echo_tune.config.load.loading import load_model
    from echo_tune.config.specs.parallel import ParallelConfig
    from echo_tune.sim.simulate import simulate

    model = load_model("llama3-8b")
    cluster = load_cluster("h100-sxm")
    parallel = ParallelConfig(tensor_model_parallel_size=1, global_batch_size=8, micro_batch_size=1)
    base = simulate(model, cluster, 8, parallel).step_time_s
    peak = simulate(model, cluster.replace(sustained_clock_mhz=cluster.gpu.peak_clock_mhz), 8, parallel).step_time_s
    slow = simulate(model, cluster.replace(sustained_clock_mhz=1000), 8, parallel).step_time_s
    assert peak < base < slow


def test_bench_gemm_fit_is_against_the_peak_clock():
    """A bench times kernels for a moment, at the boost clock: 95% of datasheet peak fits e_max 0.95 (not
    0.95 / clock_factor > 1), and the simulator then applies the sustained clock on top."""
    from echo_tune.calibrate.fit.fit_compute import fit_gemm

    cluster = load_cluster("h100-sxm")
    gpu, profile = cluster.gpu, default_profile(cluster)
    rows = []
    for size in (4096, 8192, 16384):
        flops = 2.0 * size ** 3
        eff = 0.95 * (size / (size + 128)) ** 3
        rows.append({"dtype": "bf16", "m": size, "n": size, "k": size, "_source": "synthetic",
                     "time_us": (flops / (gpu.peak_bf16_tflops * 1e12 * eff) + profile.kernel_launch_overhead_s) * 1e6})
    fitted, _ = fit_gemm(rows, profile, gpu, "bf16")
    assert fitted.gemm_max_efficiency == pytest.approx(0.95, rel=0.02)
    assert gpu.clock_factor < 0.9


def test_search_gpu_clock_flag_slows_the_best_layout_and_names_its_study(tmp_path, capsys):
    import json

    from echo_tune.cli.main import main

    def best(extra):
        assert main(["search", "--model", "llama3-8b", "--cluster", "h100-sxm", "--num-gpus", "8",
                     "--global-batch-size", "8", "--n-trials", "6", "--results-dir", str(tmp_path / "r"),
                     "--no-explain", "--json", *extra]) == 0
        return json.loads(capsys.readouterr().out)

    plain, slow = best([]), best(["--gpu-clock-mhz", "900"])
    assert slow["best"]["step_time_s"] > plain["best"]["step_time_s"]
    assert "clock900mhz" in json.dumps(slow)


def test_rank_gpu_clock_flag_slows_every_candidate(capsys):
    import json
    from pathlib import Path

    from echo_tune.cli.main import main

    rank_file = str(Path(__file__).resolve().parents[2] / "search_spaces" / "rank" / "gpt3-175b-options.yaml")
    times = []
    for extra in ([], ["--gpu-clock-mhz", "1000"]):
        assert main(["rank", rank_file, "--json", *extra]) == 0
        times.append({r["name"]: r["step_time_s"] for r in json.loads(capsys.readouterr().out) if r.get("step_time_s")})
    assert times[0] and all(times[1][name] > t for name, t in times[0].items())
