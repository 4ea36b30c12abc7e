"""Memory as Megatron allocates it: optimizer shards over DP x CP, gradient dtype, optimizer-state dtypes,
the headroom margin, and the measured Llama-3.1 8B run that must fit."""

import pytest

import echo_tune as et
from echo_tune.errors import ConfigError

LLAMA8 = et.load_model("llama3-8b")
H100 = et.load_cluster("h100-sxm")
# dgxc-benchmarking v24.11.1 Llama-3.1 8B BF16 on 8 H100 (runs_modern.csv): TP1 PP1 CP2 DP4, dist-opt
RUN = et.ParallelConfig(context_parallel_size=2, global_batch_size=128, use_distributed_optimizer=True,
                        overlap_grad_reduce=True, overlap_param_gather=True)


def mem(parallel, num_gpus=8, **kw):
    return et.simulate(LLAMA8, H100, num_gpus, parallel, **kw).stage_memory[0]


def test_distributed_optimizer_shards_over_data_and_context_parallel_ranks():
    cp2 = mem(RUN)
    cp1 = mem(RUN.replace(context_parallel_size=1), num_gpus=4)  # same DP = 4, no CP
    assert cp2.optimizer_bytes == pytest.approx(cp1.optimizer_bytes / 2, rel=1e-6)
    assert cp2.weights_bytes == cp1.weights_bytes


def test_measured_8b_run_fits_and_bf16_gradients_halve_the_buffer():
    report = et.simulate(LLAMA8, H100, 8, RUN)
    assert report.fits_memory
    bf16 = mem(RUN.replace(grad_reduce_in_bf16=True))
    assert bf16.gradients_bytes == pytest.approx(report.stage_memory[0].gradients_bytes / 2, rel=1e-6)


def test_precision_aware_optimizer_state_bytes():
    base = mem(RUN)
    states = mem(RUN.replace(use_precision_aware_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))
    assert states.optimizer_bytes == pytest.approx(base.optimizer_bytes * (4 + 2 + 2) / 12, rel=1e-6)
    with pytest.raises(ConfigError, match="use_precision_aware_optimizer"):
        et.simulate(LLAMA8, H100, 8, RUN.replace(exp_avg_dtype="bf16"))


def test_headroom_turns_a_tight_fit_into_a_no():
    report = et.simulate(LLAMA8, H100, 8, RUN)
    spare = H100.gpu.memory_bytes - report.peak_memory_bytes
    assert et.simulate(LLAMA8, H100, 8, RUN, memory_headroom_bytes=spare - 1).fits_memory
    tight = et.simulate(LLAMA8, H100, 8, RUN, memory_headroom_bytes=spare + 1)
    assert not tight.fits_memory and "headroom" in tight.notes[0]
