"""The model TFLOP/s a report gives is Megatron-LM's ``num_floating_point_operations`` (training.py,
NVIDIA/Megatron-LM d98e8a64ddf3) over the step time and GPUs, worked out here by hand for a dense
GPT-3 (causal halving) and a Llama with vocabulary padding at TP 8; for a MoE model the report gives
``sim/outputs/flops.py``'s count, which tests/sim/test_flops.py checks by hand for Mixtral and DeepSeek-V3."""

import pytest

import echo_tune as et

H100 = et.load_cluster("h100-sxm")


def reported_flops(model, num_gpus, parallel):
    report = et.simulate(model, H100, num_gpus, parallel)
    return report.model_tflops_per_gpu * 1e12 * report.step_time_s * num_gpus


def test_gpt3_reported_tflops_use_the_causal_halving():
    gpt3 = et.load_model("gpt3-175b")
    b, s, L, h = 256, 2048, 96, 12288  # preset vocabulary 51200, a multiple of 128 x TP 8 = 1024
    parallel = et.ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=8, global_batch_size=b,
                                 sequence_parallel=True, use_distributed_optimizer=True)
    padded = gpt3.padded_vocab_size(8)
    assert padded % (128 * 8) == 0
    expected = 72 * b * s * L * h * h * (1 + s / (12 * h) + padded / (12 * h * L))
    assert reported_flops(gpt3, 128, parallel) == pytest.approx(expected, rel=1e-9)


def test_llama_reported_tflops_pad_the_vocabulary_by_tp():
    # llama3-70b: h 8192, 64 heads, 8 groups, ffn 28672 (SwiGLU), 80 layers, V 128256 -> 128 x 8 = 1024: 129024
    llama = et.load_model("llama3-70b")
    b = 32
    parallel = et.ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=4, global_batch_size=b,
                                 sequence_parallel=True, use_distributed_optimizer=True)
    h, s, L, f, g, a = 8192, llama.seq_length, 80, 28672, 8, 64
    d = h // a
    per_token_layer = 6 * (h * (a * d + 2 * g * d) + a * d * h + 3 * h * f)  # QKV, proj, SwiGLU fc1 (2f) + fc2
    attention = 6 * 2 * a * d * s / 2  # QK^T and PV, causal: half
    logits = 6 * h * 129024
    expected = b * s * (L * (per_token_layer + attention) + logits)
    assert llama.padded_vocab_size(8) == 129024
    assert reported_flops(llama, 64, parallel) == pytest.approx(expected, rel=1e-9)


def test_moe_reported_tflops_are_the_flops_module_count():
    from echo_tune.sim.outputs.flops import model_flops_per_step

    mixtral = et.load_model("mixtral-8x7b")
    parallel = et.ParallelConfig(pipeline_model_parallel_size=4, expert_model_parallel_size=8, global_batch_size=64,
                                 use_distributed_optimizer=True)
    assert reported_flops(mixtral, 64, parallel) == pytest.approx(model_flops_per_step(mixtral, 64, 1), rel=1e-9)
