"""--optimizer muon (sim/data_parallel/optimizer_muon.py): states, Newton-Schulz compute and its TP all-gathers, by hand."""

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError
from echo_tune.config.rules.optimizer_rules import check_muon
from echo_tune.sim.data_parallel.optimizer_muon import (layer_matrices, matrix_params, newton_schulz_s, ns_flops,
                                          ns_gemms, ns_time_s)

LLAMA8 = et.load_model("llama3-8b")  # h 4096, 32 heads, 8 groups, head 128, SwiGLU ffn 14336, 32 layers
H100 = et.load_cluster("h100-sxm")
BASE = et.ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, global_batch_size=64)
# Muon's matrices of one llama3-8b layer, whole: q 4096x4096, k and v 1024x4096 (split QKV), proj 4096x4096,
# fc1 28672x4096 (SwiGLU), fc2 4096x14336: 16777216 + 2 * 4194304 + 16777216 + 117440512 + 58720256
LAYER_MATRIX_PARAMS = 218_103_808


def test_newton_schulz_flops_by_hand():
    # 512 x 1024: m = 512, n = 1024; per step 2*512^2*1024 + 2*512^3 + 2*512^2*1024 = 1342177280
    assert ns_gemms(1024, 512) == ((512, 512, 1024), (512, 512, 512), (512, 1024, 512))
    assert ns_flops(512, 1024, 5) == 5 * 1_342_177_280
    assert ns_flops(1024, 512, 5) == ns_flops(512, 1024, 5)  # whitened along the smaller side


def test_layer_matrices_split_qkv_and_tp_dims():
    shapes = [(m.rows, m.cols, m.tp_dim) for m in layer_matrices(LLAMA8, BASE.replace(optimizer="muon"), 1, False)]
    assert shapes == [(4096, 4096, 0), (1024, 4096, 0), (1024, 4096, 0), (4096, 4096, 1), (28672, 4096, 0),
                      (4096, 14336, 1)]
    fused = layer_matrices(LLAMA8, BASE.replace(optimizer="muon", muon_split_qkv=False), 1, False)
    assert (fused[0].rows, fused[0].cols) == (4096 + 2 * 1024, 4096)  # --muon-no-split-qkv: one QKV matrix
    assert sum(m.rows * m.cols for m in fused) == LAYER_MATRIX_PARAMS


def test_muon_keeps_one_state_less_on_its_matrices():
    adam = et.simulate(LLAMA8, H100, 16, BASE)
    muon = et.simulate(LLAMA8, H100, 16, BASE.replace(optimizer="muon"))
    # stage 0 holds 16 layers; TP 2 halves every matrix; Adam 12 -> Muon 8 bytes (no exp_avg_sq)
    saved = adam.stage_memory[0].optimizer_bytes - muon.stage_memory[0].optimizer_bytes
    assert saved == pytest.approx(4 * 16 * LAYER_MATRIX_PARAMS / 2, abs=2)
    assert muon.stage_memory[0].weights_bytes == adam.stage_memory[0].weights_bytes
    dist = et.simulate(LLAMA8, H100, 16, BASE.replace(optimizer="dist_muon"))  # DP = 16 / (2 * 2) = 4
    adam_dist = et.simulate(LLAMA8, H100, 16, BASE.replace(use_distributed_optimizer=True))
    saved = adam_dist.stage_memory[0].optimizer_bytes - dist.stage_memory[0].optimizer_bytes
    assert saved == pytest.approx(4 * 16 * LAYER_MATRIX_PARAMS / 2 / 4, abs=2)


def test_newton_schulz_time_and_tp_gathers():
    parallel = BASE.replace(optimizer="muon")
    layout = check_compatible(LLAMA8, H100, 16, parallel)
    profile = profile_for(H100)
    ns_s, gather_s = newton_schulz_s(LLAMA8, parallel, layout, profile, H100.gpu, 1, 0)
    # duplicated: every matrix whole on each TP rank
    whole = [(4096, 4096), (1024, 4096), (1024, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
    assert ns_s == pytest.approx(sum(ns_time_s(r, c, 5, profile, H100.gpu) for r, c in whole))
    assert gather_s > 0
    blockwise = parallel.replace(muon_tp_mode="blockwise")
    ns_b, gather_b = newton_schulz_s(LLAMA8, blockwise, layout, profile, H100.gpu, 1, 0)
    shards = [(2048, 4096), (512, 4096), (512, 4096), (4096, 2048), (14336, 4096), (4096, 7168)]
    assert gather_b == 0.0
    assert ns_b == pytest.approx(sum(ns_time_s(r, c, 5, profile, H100.gpu) for r, c in shards))
    # layer-wise distributed: each matrix on one of the DP = 4 ranks
    dist = parallel.replace(use_distributed_optimizer=True)
    assert newton_schulz_s(LLAMA8, dist, layout, profile, H100.gpu, 1, 0)[0] == pytest.approx(ns_s / 4)
    # ten steps cost twice five
    ten = parallel.replace(muon_num_ns_steps=10)
    assert newton_schulz_s(LLAMA8, ten, layout, profile, H100.gpu, 1, 0)[0] == pytest.approx(2 * ns_s)


def test_muon_step_adds_newton_schulz_and_the_breakdown_sums():
    adam = et.simulate(LLAMA8, H100, 16, BASE)
    muon = et.simulate(LLAMA8, H100, 16, BASE.replace(optimizer="muon"))
    assert muon.breakdown_s["optimizer"] > adam.breakdown_s["optimizer"]
    assert sum(muon.breakdown_s.values()) == pytest.approx(muon.step_time_s)


def test_moe_matrices_count_local_experts_and_router():
    mixtral = et.load_model("mixtral-8x7b")
    parallel = et.ParallelConfig(tensor_model_parallel_size=2, expert_model_parallel_size=4, optimizer="muon",
                                 pipeline_model_parallel_size=4, global_batch_size=64, sequence_parallel=True)
    matrices = layer_matrices(mixtral, parallel, 4, True)
    router = [m for m in matrices if m.rows == mixtral.num_experts]
    experts = [m for m in matrices if m.expert]
    assert len(router) == 1 and router[0].tp_dim is None
    assert [m.count for m in experts] == [2, 2]  # 8 experts over EP 4
    layout = check_compatible(mixtral, H100, 32, parallel)
    total, expert = matrix_params(mixtral, parallel, layout, 0, 1)
    h, f, etp = mixtral.hidden_size, mixtral.moe_ffn_size, parallel.expert_tensor_size
    assert expert == 2 * (2 * f * h + h * f) // etp  # two local experts' fc1 (SwiGLU) and fc2


def test_muon_rules():
    with pytest.raises(ConfigError, match="not modelled"):
        et.ParallelConfig(global_batch_size=8, optimizer="sgd")
    with pytest.raises(ConfigError, match="muon_num_ns_steps >= 1"):
        et.ParallelConfig(global_batch_size=8, optimizer="muon", muon_num_ns_steps=0)
    with pytest.raises(ConfigError, match="distributed` is not modelled"):
        et.ParallelConfig(global_batch_size=8, optimizer="muon", muon_tp_mode="distributed")
    dist = et.ParallelConfig(global_batch_size=8, optimizer="dist_muon")  # arguments.py: the deprecated spelling
    assert dist.optimizer == "muon" and dist.use_distributed_optimizer
    with pytest.raises(ConfigError, match="multi_latent_attention"):
        check_muon(et.load_model("deepseek-v3"), dist)


def test_output_gate_is_its_own_matrix_in_split_qkv():
    # emerging_optimizers.py _get_qkv_split_shapes: [q, gate, k, v] with attention_output_gate
    gated = LLAMA8.replace(attention_output_gate=True)
    shapes = [(m.rows, m.cols) for m in layer_matrices(gated, BASE.replace(optimizer="muon"), 1, False)][:4]
    assert shapes == [(4096, 4096), (4096, 4096), (1024, 4096), (1024, 4096)]
