"""The share of a predicted step the fitted host time per kernel carries (plan/host_share.py)."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.cost.host.host_time import without_host
from echo_tune.plan.host_share import MAX_SHARE, gpu_side_low_pct, host_share
from echo_tune.sim.schedule.memo import profile_for_cluster
from echo_tune.validate.datasets import published_runs
from echo_tune.validate.runs import read_runs


def test_gpu_side_low_end_by_hand():
    assert gpu_side_low_pct(-65.0, 0.0) == pytest.approx(-65.0)  # nothing host-bound: the GPU side's error
    assert gpu_side_low_pct(-50.0, 0.5) == pytest.approx(0.0)  # (1 - 0.5) / (1 - 0.5) - 1
    assert gpu_side_low_pct(-10.0, -0.2) == pytest.approx(-10.0)  # a share below 0 counts as 0
    assert gpu_side_low_pct(-90.0, 1.0) == pytest.approx(100 * (0.1 / (1 - MAX_SHARE) - 1))  # capped, finite


def test_without_host_turns_the_host_time_off_and_keeps_the_rest():
    profile = profile_for_cluster(et.load_cluster("h100"))
    assert profile.host_time_per_kernel_s > 0
    off = without_host(profile)
    assert off.host_time_per_kernel_s == 0 and off.gemm_max_efficiency == profile.gemm_max_efficiency


def test_host_bound_moe_run_and_a_dense_layout():
    row = next(c for c in read_runs(published_runs("runs_bridge_2025.csv"))
               if c.name == "mb2602-qwen3-30b-a3b-fp8cs-16xh100")
    # Qwen3-30B-A3B FP8 current scaling on 16 H100 at MBS 1: host-bound in the model (docs/moe.md)
    share = host_share(row.model, row.cluster, row.num_gpus, row.parallel)
    assert 0.4 < share < 0.8
    # the same layout in BF16 issues the same kernels from Python (TE's C++ launches the quantisations, each at the
    # launch's cost alone): about as host-bound
    bf16 = dataclasses.replace(row.parallel, fp8_format=None, fp8_param_gather=False)
    assert abs(host_share(row.model, row.cluster, row.num_gpus, bf16) - share) < 0.05
    # no host time, no share
    off = without_host(profile_for_cluster(row.cluster))
    assert host_share(row.model, row.cluster, row.num_gpus, row.parallel, profile=off) == 0.0


def test_host_bound_note_names_only_the_levers_a_layout_has():
    from echo_tune.plan.host_share import HOST_BOUND_SHARE, host_bound_note
    from echo_tune.config.specs.parallel import ParallelConfig
    moe = et.load_model("qwen3-30b-a3b")
    parallel = ParallelConfig(expert_model_parallel_size=8, micro_batch_size=2, global_batch_size=512,
                              fp8_format="hybrid", fp8_recipe="mxfp8")
    assert host_bound_note(HOST_BOUND_SHARE - 0.01, moe, parallel, 38e-6) is None
    note = host_bound_note(0.6, moe, parallel, 38e-6)
    assert note.startswith("host-bound: the GPU waits on the host for 60% of this step (host time per kernel issued "
                           "from Python 38 us")
    assert "now 2" in note and "now 16, each a GEMM" in note and "drop-and-pad" in note
    assert "quantisation" not in note  # TE's C++ launches them: a launch each, not a kernel issued from Python
    graphed = parallel.replace(cuda_graph_impl="transformer_engine")
    assert "--cuda-graph-impl" not in host_bound_note(0.6, moe, graphed, 38e-6)
    dense = host_bound_note(0.3, et.load_model("llama3-8b"), ParallelConfig(global_batch_size=64), 38e-6)
    assert "expert" not in dense and "--micro-batch-size" in dense
