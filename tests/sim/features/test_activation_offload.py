"""--fine-grained-activation-offloading: the bytes each offload group holds, what leaves the GPU, the exposed copies,
Megatron's rules (issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.errors import ConfigError
from echo_tune.sim.features.activation_offload import layer_offloaded_bytes
from echo_tune.sim.schedule.passes import trace_pieces

LLAMA8 = et.load_model("llama3-8b")  # 32 layers, h 4096, 32 heads of 128, 8 KV groups, s 8192
H100 = et.load_cluster("h100-sxm")
BASE = et.ParallelConfig(global_batch_size=8, use_distributed_optimizer=True)
OFF = BASE.replace(fine_grained_activation_offloading=True, offload_modules=("core_attn", "attn_proj"))
S = LLAMA8.seq_length


def test_core_attention_group_by_hand():
    layout = check_compatible(LLAMA8, H100, 8, OFF)
    trace = trace_pieces(LLAMA8, OFF, layout)["layer"]
    # flash attention keeps q (s x 32 x 128), k and v (s x 8 x 128 each) and its output (s x 32 x 128) in bf16,
    # and the fp32 logsumexp (32 x s); the output projection's input is that output (no more bytes)
    expected = S * (32 + 8 + 8 + 32) * 128 * 2 + 32 * S * 4
    assert layer_offloaded_bytes(trace, LLAMA8, ("core_attn", "attn_proj"), layout, False) == expected
    # with Transformer Engine the input norm is fused into the QKV linear (an IdentityOp): attn_norm holds nothing
    assert layer_offloaded_bytes(trace, LLAMA8, ("attn_norm",), layout, False) == 0


def test_memory_and_copies():
    plain, off = et.simulate(LLAMA8, H100, 8, BASE), et.simulate(LLAMA8, H100, 8, OFF)
    per_layer = S * 80 * 128 * 2 + 32 * S * 4
    # PP 1: one micro-batch in flight; PCIe (63 GB/s) drains 31 layers' groups (5.2 GB) within the ~0.1 s forward,
    # the last layer's copy starts as it ends, and one layer's groups are kept back for the whole step: 30 leave
    saved = plain.stage_memory[0].activations_bytes - off.stage_memory[0].activations_bytes
    assert saved == pytest.approx((32 - 2) * per_layer)
    # each layer's group goes out and back over PCIe 5.0 x16 (63 GB/s): 169 MB in 2.7 ms, under a layer's
    # forward (~4 ms of GEMMs and attention at 8k tokens) and backward: hidden
    assert per_layer / 63e9 == pytest.approx(2.68e-3, rel=0.01)
    assert off.breakdown_s["offload"] == plain.breakdown_s["offload"] == 0


def test_the_link_limits_what_leaves_during_a_forward():
    from echo_tune.sim.features.activation_offload import drained_bytes

    layout = check_compatible(LLAMA8, H100, 8, OFF)
    pieces = trace_pieces(LLAMA8, OFF, layout)
    per_layer = S * 80 * 128 * 2 + 32 * S * 4
    # 10 ms of forward over PCIe 5.0 x16: 630 MB copied, of 32 layers' 5.4 GB; 1 s: all but the last layer's
    assert drained_bytes(pieces, LLAMA8, OFF, layout, 32, 0, 0.010, "h100-sxm") == pytest.approx(63e9 * 0.010)
    assert drained_bytes(pieces, LLAMA8, OFF, layout, 32, 0, 1.0, "h100-sxm") == pytest.approx(31 * per_layer)
    # NVLink-C2C on GB200: 225 GB/s per GPU and direction
    assert drained_bytes(pieces, LLAMA8, OFF, layout, 32, 0, 0.010, "gb200") == pytest.approx(225e9 * 0.010)


def test_copies_longer_than_the_layer_are_exposed():
    # hidden 256, 4 heads of 64, 1k tokens, micro-batch 64: a layer's forward is about a millisecond (mostly the
    # host issuing its kernels); its core-attention group 64 x (1024 x (4 + 4 + 4 + 4) x 64 x 2 + 4 x 1024 x 4)
    # = 135,266,304 bytes (129 MiB), 2.15 ms per copy over PCIe 5.0 x16
    tiny = et.ModelSpec(name="tiny", num_layers=4, hidden_size=256, num_attention_heads=4, seq_length=1024,
                        vocab_size=1024)
    off = et.simulate(tiny, H100, 8, OFF.replace(micro_batch_size=64, global_batch_size=512))
    copy_s = 135_266_304 / 63e9
    assert any("129 MiB per layer" in n for n in off.notes)
    assert 0 < off.breakdown_s["offload"] <= 4 * 2 * copy_s  # one micro-batch, 4 layers, out and back


@pytest.mark.parametrize("kw, match", [
    (dict(offload_modules=("attn_proj",)), "without core_attn"),
    (dict(offload_modules=None), "needs --offload-modules"),
    (dict(offload_modules=("fused_group_mlp",)), "not modelled"),
    (dict(offload_modules=("core_attn",), cpu_offloading_num_layers=2), "cannot be enabled with cpu_offloading"),
])
def test_rules(kw, match):
    with pytest.raises(ConfigError, match=match):
        et.simulate(LLAMA8, H100, 8, OFF.replace(**kw))
