"""sim/memory/fsdp_memory.py: bytes per parameter under each Megatron-FSDP sharding strategy, worked by hand."""

import pytest

import echo_tune as et
from echo_tune.sim.memory.fsdp_memory import fsdp_buffer_bytes, fsdp_bytes_per_param

FSDP = et.ParallelConfig(use_megatron_fsdp=True, global_batch_size=64)


@pytest.mark.parametrize("strategy, expected", [
    # bf16 weights (2), main grads auto = bf16 (2), fp32 main weights + Adam m, v (4 + 8 = 12); d = 8
    ("no_shard", (2.0, 2.0, 12.0)),                  # 16 B per parameter, nothing sharded
    ("optim", (2.0, 2.0, 12 / 8)),                   # 5.5 B
    ("optim_grads", (2.0, 2 / 8, 12 / 8)),           # 3.75 B
    ("optim_grads_params", (2 / 8, 2 / 8, 12 / 8)),  # 2.0 B (ZeRO-3: 16 / 8)
])
def test_bytes_per_param_by_strategy(strategy, expected):
    got = fsdp_bytes_per_param(FSDP.replace(data_parallel_sharding_strategy=strategy), 8)
    assert got == pytest.approx(expected)


def test_dtypes_and_hsdp_outer_optim():
    # fp32 main grads, no main-weight copy (auto): (2 + 4 + 8) / 8 = 1.75 B
    fp32_grads = FSDP.replace(megatron_fsdp_main_grads_dtype="fp32", megatron_fsdp_main_params_dtype="auto")
    assert sum(fsdp_bytes_per_param(fp32_grads, 8)) == pytest.approx(1.75)
    # HSDP, 2 replicas of 4 with the optimizer sharded over all 8: 2/4 + 2/4 + 12/8 = 2.5 B
    assert sum(fsdp_bytes_per_param(FSDP, 4, 8)) == pytest.approx(2.5)


def test_working_buffers_of_two_units():
    unit = 100e6  # parameters of one layer
    # ZeRO-3: 2 units x (bf16 gathered weights 2 + bf16 unsharded grads 2) = 800 MB
    assert fsdp_buffer_bytes(FSDP, unit) == pytest.approx(800e6)
    # fp32 gradient communication: 2 x (2 + 4) = 1.2 GB; optim_grads gathers no weights: 2 x 2 = 400 MB
    assert fsdp_buffer_bytes(FSDP.replace(megatron_fsdp_grad_comm_dtype="fp32"), unit) == pytest.approx(1.2e9)
    assert fsdp_buffer_bytes(FSDP.replace(data_parallel_sharding_strategy="optim_grads"), unit) == \
        pytest.approx(400e6)
    assert fsdp_buffer_bytes(FSDP.replace(data_parallel_sharding_strategy="optim"), unit) == 0.0


def test_simulated_stage_memory_shards_as_the_strategy_says():
    model, cluster = et.load_model("llama3-8b"), et.load_cluster("h100-sxm")
    runs = {s: et.simulate(model, cluster, 8, FSDP.replace(data_parallel_sharding_strategy=s)).stage_memory[0]
            for s in ("no_shard", "optim_grads_params")}
    plain, zero3 = runs["no_shard"], runs["optim_grads_params"]
    params = plain.weights_bytes / 2  # bf16 weights, whole under no_shard
    assert plain.gradients_bytes == pytest.approx(2 * params, rel=1e-9)
    assert plain.optimizer_bytes == pytest.approx(12 * params, rel=1e-9)
    assert zero3.gradients_bytes == pytest.approx(2 * params / 8, rel=1e-6)   # DP 8
    assert zero3.optimizer_bytes == pytest.approx(12 * params / 8, rel=1e-6)
    # the embedding, output layer (128256 x 4096 each) and final RMSNorm (4096), outside the units, stay whole
    root = 2 * 128256 * 4096 + 4096
    assert zero3.weights_bytes == pytest.approx(2 * (params - root) / 8 + 2 * root, rel=1e-6)
    assert zero3.fsdp_buffer_bytes > 0 and plain.fsdp_buffer_bytes == 0
