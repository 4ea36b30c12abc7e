"""After `profile`, the simulator takes its compute times from the database and says how much."""

import dataclasses

import echo_tune as et
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.sim.schedule.passes import trace_pieces


def test_simulate_reports_measured_share_after_profile(profiled):
    model, cluster, layout, profile = profiled
    report = et.simulate(model, cluster, 4, layout, profile=profile)
    assert report.measured_compute_share >= 0.95
    assert report.to_dict()["measured_compute_share"] == report.measured_compute_share
    assert any("measured on 'cpu" in note for note in report.notes)
    plain = et.simulate(model, cluster, 4, layout)
    assert plain.measured_compute_share is None and plain.to_dict()["measured_compute_share"] is None


def test_measured_time_replaces_the_surface(profiled):
    model, cluster, layout, profile = profiled
    times = profile.op_times
    assert times.host_overhead_s > 0  # CPU: the framework's host time per op, measured on meta
    pieces = trace_pieces(model, layout, et.check_compatible(model, cluster, 4, layout))
    gemm = next(op for op in pieces["layer"].forward if op.kind == "gemm")
    assert op_time_s(gemm, profile, cluster.gpu, "fp32") == times.times[gemm.key] + times.host_overhead_s
    surface = dataclasses.replace(profile, op_times=None)
    assert op_time_s(gemm, surface, cluster.gpu, "fp32") != op_time_s(gemm, profile, cluster.gpu, "fp32")


def test_a_layout_outside_the_database_falls_back_to_the_surface(profiled):
    model, cluster, _layout, profile = profiled
    other = et.ParallelConfig(tensor_model_parallel_size=1, pipeline_model_parallel_size=2, global_batch_size=4,
                              precision="fp32")  # TP1 shapes were never measured
    report = et.simulate(model, cluster, 2, other, profile=profile)
    assert report.measured_compute_share < 0.5


def test_fp8_gemms_are_not_counted_as_measured(profiled):
    """Under FP8 the linear GEMMs are priced from the FP8 peak (cost/kernels/fp8.py), not from the database's
    plain-precision times, so they leave the measured share; the other measured ops stay in it."""
    from echo_tune.sim.outputs.optime_coverage import measured_compute_share

    model, cluster, layout, profile = profiled
    checked = et.check_compatible(model, cluster, 4, layout)
    pieces = trace_pieces(model, layout, checked)
    plain = measured_compute_share(pieces, checked, 0, profile, cluster, "fp32")
    # a CPU has no FP8 peak: give the test cluster's device one, as an FP8 GPU has
    gpu = dataclasses.replace(cluster.gpu, peak_fp8_tflops=2 * cluster.gpu.peak_bf16_tflops)
    fp8 = measured_compute_share(pieces, checked, 0, profile, dataclasses.replace(cluster, gpu=gpu), "fp32", fp8=True)
    assert plain >= 0.95
    assert 0 < fp8 < plain - 0.2
