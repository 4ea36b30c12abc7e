"""--defer-embedding-wgrad-compute: the output layer's wgrad GEMMs of the last stage moved to the flush."""

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.costing import CostContext
from echo_tune.sim.features.deferred_wgrad import deferred_wgrad
from echo_tune.sim.schedule.passes import trace_pieces

TINY = et.load_model("tests/data/tiny-llama.yaml")  # h 256, seq 256, vocab 1000 (padded to 1024)
H100 = et.load_cluster("h100-sxm")
PP2 = et.ParallelConfig(pipeline_model_parallel_size=2, global_batch_size=8, defer_embedding_wgrad_compute=True)


def _deferral(parallel, num_gpus=2):
    layout = check_compatible(TINY, H100, num_gpus, parallel)
    profile = profile_for(H100)
    ctx = CostContext(profile=profile, gpu=H100.gpu, precision="bf16", groups=layout.groups)
    output = trace_pieces(TINY, parallel, layout)["output"]
    return deferred_wgrad(output, ctx, layout.num_micro_batches, parallel.wgrad_deferral_limit), output, profile


@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_the_deferred_gemm_is_the_output_wgrad():
    defer, output, profile = _deferral(PP2)
    # wgrad of the logits GEMM: [vocab 1024, tokens 256] x [tokens 256, hidden 256] -> 2 * 1024 * 256 * 256 FLOPs
    wgrad = [op for op in output.backward if op.kind == "gemm" and op.flops == 2 * 1024 * 256 * 256]
    assert len(wgrad) == 2  # dgrad and wgrad have the same FLOPs; the wgrad is the (vocab, hidden, tokens) one
    w = op_time_s(next(op for op in wgrad if op.gemm_mnk == (1024, 256, 256)), profile, H100.gpu, "bf16")
    assert defer.deferred_micro_batches == 8
    assert defer.saved_per_backward.total_s == pytest.approx(w, rel=1e-12)  # no SP: no all-gather moved
    assert defer.drain.total_s == pytest.approx(8 * w, rel=1e-12)
    # buffers: per micro-batch the input [256, 1, 256] bf16 and the logits gradient [256, 1024] bf16
    assert defer.buffer_bytes == 8 * (256 * 256 * 2 + 256 * 1024 * 2)


def test_limit_defers_only_the_first_micro_batches():
    defer, _, _ = _deferral(PP2.replace(wgrad_deferral_limit=3))
    full, _, _ = _deferral(PP2)
    assert defer.deferred_micro_batches == 3
    assert defer.drain.total_s == pytest.approx(3 / 8 * full.drain.total_s, rel=1e-12)


def test_sequence_parallel_drain_pipelines_the_all_gathers():
    parallel = PP2.replace(tensor_model_parallel_size=2, sequence_parallel=True)
    defer, output, _ = _deferral(parallel, num_gpus=4)
    # drain_embedding_wgrad_compute: the first all-gather alone, then each GEMM beside the next all-gather
    from echo_tune.sim.schedule.costing import phase_cost
    from echo_tune.sim.features.deferred_wgrad import _wgrad_ops

    layout = check_compatible(TINY, H100, 4, parallel)
    ctx = CostContext(profile=profile_for(H100), gpu=H100.gpu, precision="bf16", groups=layout.groups)
    wgrad, gather = _wgrad_ops(output)
    w, ag = phase_cost((wgrad,), ctx).total_s, phase_cost((gather,), ctx).total_s
    assert ag > 0 and w > 0
    assert defer.drain.total_s == pytest.approx(ag + 7 * max(w, ag) + w, rel=1e-9)
    assert defer.drain.compute_s == pytest.approx(8 * w, rel=1e-12)


def test_step_moves_the_wgrad_into_the_flush():
    model = et.load_model("llama3-8b")
    parallel = et.ParallelConfig(pipeline_model_parallel_size=4, global_batch_size=16, use_distributed_optimizer=True)
    plain = et.simulate(model, H100, 4, parallel)
    deferred = et.simulate(model, H100, 4, parallel.replace(defer_embedding_wgrad_compute=True))
    # the same work (compute part unchanged), less waiting on the last stage's backward
    assert deferred.breakdown_s["compute"] == pytest.approx(plain.breakdown_s["compute"], rel=1e-9)
    assert deferred.step_time_s < plain.step_time_s
    assert sum(deferred.breakdown_s.values()) == pytest.approx(deferred.step_time_s, rel=1e-12)
    # the last stage keeps 16 x ([8192, 4096] + [8192, 128256]) bf16 buffers
    extra = deferred.stage_memory[-1].activations_bytes - plain.stage_memory[-1].activations_bytes
    assert extra == 16 * (8192 * 4096 * 2 + 8192 * 128256 * 2)


def test_needs_pipeline_parallelism():
    with pytest.raises(ConfigError, match="pipeline model parallel"):
        et.simulate(TINY, H100, 1, et.ParallelConfig(global_batch_size=8, defer_embedding_wgrad_compute=True))


@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_saving_is_what_the_backward_no_longer_holds():
    """In the backward the output layer's input all-gather runs beside its dgrad GEMM and its dgrad
    reduce-scatter beside its wgrad GEMM (Megatron's async_op=True): deferring them saves the backward's cost
    with them less its cost without them (the reduce-scatter then exposed), less than the GEMM plus the
    all-gather alone."""
    from echo_tune.sim.schedule.costing import phase_cost
    from echo_tune.sim.features.deferred_wgrad import _wgrad_ops

    parallel = PP2.replace(tensor_model_parallel_size=2, sequence_parallel=True)
    defer, output, _ = _deferral(parallel, num_gpus=4)
    layout = check_compatible(TINY, H100, 4, parallel)
    ctx = CostContext(profile=profile_for(H100), gpu=H100.gpu, precision="bf16", groups=layout.groups)
    wgrad, gather = _wgrad_ops(output)
    alone = phase_cost((wgrad,), ctx).total_s + phase_cost((gather,), ctx).total_s
    kept = tuple(op for op in output.backward if op is not wgrad and op is not gather)
    full = phase_cost(output.backward, ctx, piece="output").total_s
    assert defer.saved_per_backward.total_s == pytest.approx(full - phase_cost(kept, ctx, piece="output").total_s)
    assert 0 < defer.saved_per_backward.total_s < alone
