"""Layer variants in the step: sliding-window layer mix, unfused gradient accumulation, deterministic mode."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import GroupPlacement, check_compatible
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import default_profile
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.grad_accumulation import accumulation_bytes_per_param
from echo_tune.sim.schedule.layer_mix import chunk_window_mix

H100 = et.load_cluster("h100-sxm")
MODEL = et.ModelSpec(name="small", num_layers=8, hidden_size=1024, num_attention_heads=16, seq_length=4096,
                     vocab_size=32000, swiglu=True, normalization="RMSNorm", position_embedding_type="rope",
                     add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0)
PAR = et.ParallelConfig(tensor_model_parallel_size=1, pipeline_model_parallel_size=2, micro_batch_size=1,
                        global_batch_size=16)


def sim(model=MODEL, parallel=PAR, num_gpus=2):
    return et.simulate(model, H100, num_gpus, parallel)


def test_window_mix_per_stage():
    # skip freq 2 over 8 layers: layers 1, 3, 5, 7 (1-based) windowed; PP2 -> 4 layers a stage, 2 windowed each
    model = MODEL.replace(window_size=(128, 0), window_attn_skip_freq=2)
    layout = check_compatible(model, H100, 2, PAR)
    assert chunk_window_mix(model, layout) == (((2, 0),), ((2, 0),))
    assert chunk_window_mix(MODEL, layout) == (((0, 0),), ((0, 0),))


@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_window_shortens_the_step_keeps_memory_and_megatron_flops():
    base, half = sim(), sim(MODEL.replace(window_size=(128, 0), window_attn_skip_freq=2))
    every = sim(MODEL.replace(window_size=(128, 0)))
    assert every.step_time_s < half.step_time_s < base.step_time_s
    assert half.peak_memory_bytes == base.peak_memory_bytes  # flash keeps no s x s matrix either way
    assert half.model_flops_per_step == base.model_flops_per_step  # Megatron's count ignores the window
    assert sum(half.breakdown_s.values()) == pytest.approx(half.step_time_s, rel=1e-12)


def test_window_with_context_parallel_is_refused():
    with pytest.raises(ConfigError, match="context_parallel_size"):
        sim(MODEL.replace(window_size=(128, 0)), PAR.replace(context_parallel_size=2), 4)


def test_unfused_gradient_accumulation_bytes_by_hand_and_time():
    # read fp32 main_grad (4) + read bf16 grad (2) + write fp32 main_grad (4) = 10 bytes per parameter;
    # with --grad-reduce-in-bf16: 2 + 2 + 2 = 6; fused: nothing extra
    off = PAR.replace(gradient_accumulation_fusion=False)
    assert accumulation_bytes_per_param(off) == 10
    assert accumulation_bytes_per_param(off.replace(grad_reduce_in_bf16=True)) == 6
    assert accumulation_bytes_per_param(PAR) == 0
    assert sim(parallel=off).step_time_s > sim().step_time_s
    assert sim(parallel=off).peak_memory_bytes == sim().peak_memory_bytes


def test_deterministic_mode_refuses_what_megatron_refuses():
    with pytest.raises(ConfigError, match="cross_entropy_loss_fusion"):
        sim(MODEL.replace(cross_entropy_loss_fusion=True), PAR.replace(deterministic_mode=True))


def test_deterministic_mode_runs_sinks_unfused_and_rings_only():
    det = PAR.replace(deterministic_mode=True)
    sinks = MODEL.replace(softmax_type="learnable", seq_length=1024)
    fused, unfused = sim(sinks), sim(sinks, det)
    assert unfused.peak_memory_bytes > fused.peak_memory_bytes  # the unfused attention keeps s x s scores
    assert any("deterministic" in n for n in unfused.notes)
    profile = default_profile(H100)
    ring = dataclasses.replace(profile, nccl_ring_only=True)
    place = GroupPlacement(size=64, ranks_per_node=8, num_nodes=8)
    size = 64 * 2**20
    assert collective_time_s("all_reduce", size, place, ring) >= collective_time_s("all_reduce", size, place, profile)
