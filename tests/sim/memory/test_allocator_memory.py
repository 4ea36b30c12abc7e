"""sim/memory/allocator_memory.py: GEMM workspaces and the loss's logits working set, worked by hand from the
PyTorch / Transformer Engine / Megatron-LM (d98e8a64ddf3) sources the module cites."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.sim.memory.allocator_memory import loss_working_bytes, torch_cublas_workspace_bytes, workspace_bytes

MIB = 1 << 20
H100, A100, GB200 = (et.load_cluster(c).gpu for c in ("h100-sxm", "a100-80gb", "gb200-nvl72"))
# Megatron-LM's functional-test GPT: 12 layers, hidden 512, 8 heads, seq 1024, GPT-2 vocabulary
TINY = et.ModelSpec(name="tiny", num_layers=12, hidden_size=512, num_attention_heads=8, seq_length=1024,
                    vocab_size=50257)
DET = et.ParallelConfig(micro_batch_size=4, global_batch_size=32, deterministic_mode=True)


def test_cublas_workspace_follows_cublas_workspace_config():
    # --deterministic-mode sets CUBLAS_WORKSPACE_CONFIG=:4096:8 (determinism.py): 8 x 4096 KiB on every GPU
    assert torch_cublas_workspace_bytes(A100, True) == torch_cublas_workspace_bytes(GB200, True) == 32 * MIB
    # unset, PyTorch picks :4096:8 on Hopper and Blackwell and :4096:2:16:8 elsewhere (CublasHandlePool.cpp)
    assert torch_cublas_workspace_bytes(H100, False) == torch_cublas_workspace_bytes(GB200, False) == 32 * MIB
    assert torch_cublas_workspace_bytes(A100, False) == 2 * 4096 * 1024 + 8 * 16 * 1024


@pytest.mark.parametrize(("gpu", "deterministic", "expected_mib"), [
    (H100, True, 2 * 32 + 32),        # two torch workspaces + TE's 32 MiB (compute capability 9)
    (A100, True, 2 * 32 + 4),         # TE's workspace is 4 MiB before Hopper
    (A100, False, 2 * 8.125 + 4),     # torch's default off sm90: 8 MiB + 128 KiB
    (GB200, False, 2 * 32 + 32),
])
def test_dense_workspaces(gpu, deterministic, expected_mib):
    assert workspace_bytes(gpu, TINY, DET.replace(deterministic_mode=deterministic)) == expected_mib * MIB


def test_te_grouped_gemm_adds_four_stream_workspaces_and_local_has_none():
    moe = dataclasses.replace(TINY, num_experts=8, moe_grouped_gemm=True)
    assert workspace_bytes(H100, moe, DET) == (2 * 32 + 5 * 32) * MIB
    assert workspace_bytes(A100, moe, DET) == (2 * 32 + 5 * 4) * MIB
    assert workspace_bytes(H100, dataclasses.replace(moe, moe_grouped_gemm=False), DET) == (2 * 32 + 32) * MIB
    assert workspace_bytes(H100, dataclasses.replace(TINY, transformer_impl="local"), DET) == 2 * 32 * MIB


def test_loss_working_set_per_logit():
    logits = 4 * 1024 * 50304  # micro-batch x sequence x vocabulary padded to 128
    assert loss_working_bytes(TINY, DET) == 2 * logits  # bf16 logits beside the fp32 copy
    native = dataclasses.replace(TINY, cross_entropy_loss_fusion=True)
    assert loss_working_bytes(native, DET) == 6 * logits  # + the jit-fused path's second fp32 tensor
    te = dataclasses.replace(native, cross_entropy_fusion_impl="te")
    assert loss_working_bytes(te, DET) == 2 * logits
    # TP shards the vocabulary (padded to 128 x TP: 50432), CP the sequence
    assert loss_working_bytes(TINY, DET.replace(tensor_model_parallel_size=2, context_parallel_size=2)) \
        == 2 * 4 * (1024 // 2) * (50432 // 2)


def test_stage_memory_carries_both():
    report = et.simulate(TINY, et.load_cluster("h100-sxm"), 8, DET.replace(use_distributed_optimizer=True))
    last = report.stage_memory[-1]
    assert last.workspace_bytes == 96 * MIB
    assert last.steady_bytes == last.weights_bytes + last.gradients_bytes + last.optimizer_bytes + 96 * MIB
    assert last.total_bytes == last.steady_bytes + last.activations_bytes + last.reserve_bytes
    # the loss's working set sits on the activation peak: the native fused path adds 4 bytes per logit more
    # (the fused path is refused beside --deterministic-mode, as Megatron refuses it)
    plain = DET.replace(use_distributed_optimizer=True, deterministic_mode=False)
    unfused = et.simulate(TINY, et.load_cluster("h100-sxm"), 8, plain).stage_memory[-1]
    fused = et.simulate(dataclasses.replace(TINY, cross_entropy_loss_fusion=True), et.load_cluster("h100-sxm"), 8,
                        plain).stage_memory[-1]
    assert fused.activations_bytes - unfused.activations_bytes == pytest.approx(4 * 4 * 1024 * 50304, rel=0.02)


def test_every_gpu_preset_has_its_compute_capability():
    from echo_tune.config.load.loading import preset_names
    from echo_tune.sim.memory.allocator_memory import COMPUTE_CAPABILITY

    assert set(preset_names("gpus")) <= set(COMPUTE_CAPABILITY)  # not the FP8-or-not guess of an unknown GPU
