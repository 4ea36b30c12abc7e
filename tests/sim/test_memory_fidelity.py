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
    # TE's FusedAdam keeps the fp32 masters of bf16 parameters as their 16 low bits (store_param_remainders,
    # Megatron-LM d98e8a64ddf3 optimizer/__init__.py + distrib_optimizer.py int16 shard): 2 + 2 + 2 of 4 + 4 + 4
    assert states.optimizer_bytes == pytest.approx(base.optimizer_bytes * (2 + 2 + 2) / 12, rel=1e-6)
    fp32_states = mem(RUN.replace(use_precision_aware_optimizer=True))
    assert fp32_states.optimizer_bytes == pytest.approx(base.optimizer_bytes * (2 + 4 + 4) / 12, rel=1e-6)
    with pytest.raises(ConfigError, match="use_precision_aware_optimizer"):
        et.simulate(LLAMA8, H100, 8, RUN.replace(exp_avg_dtype="bf16"))


def test_fp8_current_scaling_keeps_full_fp32_masters():
    # FP8 tensorwise (not delayed) with fp32 masters: Megatron-Core keeps the masters itself
    # (use_precision_aware_optimizer_no_fp8_or_ds_fp8 is False): 4 + 2 + 2 bytes
    fp8 = RUN.replace(fp8_format="hybrid", fp8_recipe="tensorwise")
    base = mem(fp8)
    states = mem(fp8.replace(use_precision_aware_optimizer=True, exp_avg_dtype="bf16", exp_avg_sq_dtype="bf16"))
    assert states.optimizer_bytes == pytest.approx(base.optimizer_bytes * (4 + 2 + 2) / 12, rel=1e-6)


def test_bf16_main_grads_halve_the_grad_buffer_and_its_reduction():
    # --main-grads-dtype bf16 (training/arguments.py: no fp32 accumulation forced) -> a bf16 grad buffer:
    # 2 bytes per parameter instead of 4, and so is each reduce-scatter message
    from echo_tune.sim.data_parallel.dp import grad_bytes_per_param

    aware = RUN.replace(use_precision_aware_optimizer=True)
    fp32 = et.simulate(LLAMA8, H100, 8, aware)
    bf16 = et.simulate(LLAMA8, H100, 8, aware.replace(main_grads_dtype="bf16"))
    params = LLAMA8.num_params()  # TP1 PP1: every parameter on the rank (untied embeddings counted once each)
    assert fp32.stage_memory[0].gradients_bytes == pytest.approx(4 * params, rel=1e-6)
    assert bf16.stage_memory[0].gradients_bytes == pytest.approx(2 * params, rel=1e-6)
    assert grad_bytes_per_param(aware.replace(main_grads_dtype="bf16")) == 2.0
    exposed = aware.replace(overlap_grad_reduce=False, overlap_param_gather=False)  # the reduction on the step
    assert et.simulate(LLAMA8, H100, 8, exposed.replace(main_grads_dtype="bf16")).breakdown_s["dp_comm"] < \
        et.simulate(LLAMA8, H100, 8, exposed).breakdown_s["dp_comm"]
    with pytest.raises(ConfigError, match="main_grads_dtype"):
        et.simulate(LLAMA8, H100, 8, RUN.replace(main_grads_dtype="bf16"))


def test_headroom_turns_a_tight_fit_into_a_no():
    report = et.simulate(LLAMA8, H100, 8, RUN)
    spare = H100.gpu.memory_bytes - report.peak_memory_bytes
    assert et.simulate(LLAMA8, H100, 8, RUN, memory_headroom_bytes=spare - 1).fits_memory
    tight = et.simulate(LLAMA8, H100, 8, RUN, memory_headroom_bytes=spare + 1)
    assert not tight.fits_memory and "headroom" in tight.notes[0]
