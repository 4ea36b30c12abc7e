"""FP8 GEMMs beside fp32 parameters (no --bf16), which Megatron-LM allows: what changes with 4-byte activations,
worked by hand (cost/kernels/fp8.py, sim/memory/stage.py; issue 39)."""

import pytest

import echo_tune as et
from echo_tune.cost.kernels.fp8 import cast_bytes_per_element, fp8_collective_bytes
from echo_tune.sim.memory.stage import fp8_main_copy_bytes_per_param, fp8_weight_bytes_per_param, \
    saved_bytes_less_per_element
from echo_tune.workload.graph import Op

H100 = et.load_cluster("h100-sxm")


def test_quantisation_reads_four_bytes_per_element():
    # current scaling on Hopper: read for the amax, read to cast, write FP8 and its transpose: 2 + 2 + 1 + 1 = 6 B
    # from bf16; from fp32 the two reads take 4 B each: 10 B
    assert cast_bytes_per_element("tensorwise", H100.gpu, "bf16") == 6.0
    assert cast_bytes_per_element("tensorwise", H100.gpu, "fp32") == 10.0
    assert cast_bytes_per_element("delayed", H100.gpu, "fp32") == 4.0 + 2.0  # one read


def test_collectives_and_saved_inputs_shrink_from_four_bytes():
    gather = Op(name="all_gather", kind="collective", phase="fwd", region="qkv", collective="all_gather",
                group="tp", size_bytes=4_000_000)
    assert fp8_collective_bytes(gather, "tensorwise", "fp32") == 1_000_000  # fp32 elements -> 1-byte FP8
    assert fp8_collective_bytes(gather, "tensorwise", "bf16") == 2_000_000
    fp32 = et.ParallelConfig(precision="fp32", fp8_format="e4m3", fp8_recipe="tensorwise", global_batch_size=8)
    assert saved_bytes_less_per_element(fp32) == 3.0  # a saved FP8 copy (1 B) instead of the fp32 input (4 B)


def test_fp8_weights_of_fp32_training():
    # --fp8-param-gather: the FP8 weight and its transpose (1 + 1 B) replace the fp32 weight (4 B), and the
    # distributed optimizer keeps an fp32 main copy of it, sharded over DP x CP (8 here)
    p = et.ParallelConfig(precision="fp32", fp8_format="e4m3", fp8_recipe="tensorwise", fp8_param_gather=True,
                          use_distributed_optimizer=True, global_batch_size=8)
    assert fp8_weight_bytes_per_param(p) == -2.0
    assert fp8_main_copy_bytes_per_param(p, 8) == 0.5
    bf16 = p.replace(precision="bf16")
    assert fp8_weight_bytes_per_param(bf16) == 0.0 and fp8_main_copy_bytes_per_param(bf16, 8) == 0.0


def test_an_fp32_fp8_step_simulates():
    model = et.load_model("llama3-8b")
    p = et.ParallelConfig(precision="fp32", fp8_format="hybrid", fp8_recipe="tensorwise", global_batch_size=8,
                          use_distributed_optimizer=True)
    fp32, bf16 = et.simulate(model, H100, 8, p), et.simulate(model, H100, 8, p.replace(precision="bf16"))
    assert fp32.step_time_s > bf16.step_time_s  # twice the bytes in every memory-bound kernel
    assert fp32.stage_memory[0].activations_bytes > bf16.stage_memory[0].activations_bytes
    fp16 = et.simulate(model, H100, 8, p.replace(precision="fp16"))  # 2-byte activations, as bf16
    assert fp16.stage_memory[0].activations_bytes == bf16.stage_memory[0].activations_bytes
