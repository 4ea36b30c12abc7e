"""--test-mode: Megatron's real-time QK-layernorm checks in every self-attention forward, counted and timed by hand
(Megatron-LM d98e8a64ddf3 core/transformer/attention.py run_realtime_tests; issue 39)."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.sim.schedule.memo import profile_for_cluster
from echo_tune.sim.features.realtime_tests import checks_per_layer, gathered_bytes

H100 = et.load_cluster("h100-sxm")
# 12 layers, hidden 512, 8 heads (head_dim 64): the functional test gpt3_mcore_te_tp4_pp1_qk_layernorm_test_mode
MODEL = et.ModelSpec(name="tiny", num_layers=12, hidden_size=512, num_attention_heads=8, ffn_hidden_size=2048,
                     seq_length=1024, vocab_size=50257, qk_layernorm=True)
BASE = et.ParallelConfig(tensor_model_parallel_size=4, micro_batch_size=4, global_batch_size=32)


def test_the_flag():
    _, parallel, _, _ = parse_megatron_line("--test-mode")
    assert parallel["test_mode"] is True


def test_counts_by_hand():
    # TP 4, DP 2: stack (1), then per copy of each group (2 + 4 = 6) an eq and an all for each of 4 tensors (48);
    # each all read by an assert: 24 host synchronisations
    assert checks_per_layer(2, 4) == (49, 24)
    # [4, 64] bf16 gathered from 2 ranks: 2 x 4 x 64 x 2 = 1024 bytes on each rank
    assert gathered_bytes(2, 64, 2) == 1024


def test_step_grows_by_the_checks_of_every_layer_and_micro_batch():
    plain = et.simulate(MODEL, H100, 8, BASE)
    test = et.simulate(MODEL, H100, 8, BASE.replace(test_mode=True))
    layout = check_compatible(MODEL, H100, 8, BASE)
    profile = profile_for_cluster(H100)
    dp, tp = layout.groups["dp"], layout.groups["tp"]
    assert (dp.size, tp.size) == (2, 4)
    per_layer = 49 * profile.host_time_per_kernel_s + \
        collective_time_s("all_gather", 1024, dp, profile) + collective_time_s("all_gather", 2048, tp, profile)
    micro_batches = 32 // (4 * 2)  # PP 1: every micro-batch's forward adds the 12 layers' checks to the step
    assert test.step_time_s - plain.step_time_s == pytest.approx(12 * micro_batches * per_layer, rel=1e-9)
    assert any("--test-mode" in n and "49 kernels" in n for n in test.notes)


def test_nothing_without_qk_layernorm():
    model = dataclasses.replace(MODEL, qk_layernorm=False)
    plain = et.simulate(model, H100, 8, BASE)
    test = et.simulate(model, H100, 8, BASE.replace(test_mode=True))
    assert test.step_time_s == plain.step_time_s
