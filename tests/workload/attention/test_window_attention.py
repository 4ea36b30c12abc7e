"""Sliding-window attention: key counts, traced FLOPs against the causal kernel, memory unchanged."""

from echo_tune.config.specs.model import ModelSpec
from echo_tune.workload.tracer import trace_layer, trace_window_layer
from echo_tune.workload.attention.window_attention import window_key_count

# s = 256 tokens, window 63: query i sees min(64, i + 1) keys
MODEL = ModelSpec(num_layers=2, hidden_size=256, num_attention_heads=4, seq_length=256, vocab_size=512,
                  window_size=(63, 0), hidden_dropout=0.0, attention_dropout=0.0)


def test_key_count_by_hand():
    # s = 8, w = 2: keys per query 1, 2, 3, 3, 3, 3, 3, 3 -> 21
    assert window_key_count(8, 2) == 21
    assert window_key_count(4, 10) == 10  # window longer than the sequence: causal 1 + 2 + 3 + 4


def _attention_flops(trace, phase):
    return sum(op.flops for op in getattr(trace, phase) if op.kind == "attention")


def test_window_attention_flops_ratio_by_hand():
    # window: sum_i min(64, i + 1) = 64 * 65 / 2 + (256 - 64) * 64 = 2080 + 12288 = 14368 keys;
    # causal (the flash formula): 256^2 / 2 = 32768 -> ratio 14368 / 32768 = 0.4384765625, forward and backward
    full = trace_layer(MODEL, tensor_model_parallel_size=1, micro_batch_size=2)
    window = trace_window_layer(MODEL, tensor_model_parallel_size=1, micro_batch_size=2)
    for phase in ("forward", "backward"):
        assert _attention_flops(window, phase) / _attention_flops(full, phase) == 14368 / 32768
    # forward by hand: 2 * b * heads * (d + d) * keys = 2 * 2 * 4 * 128 * 14368
    assert _attention_flops(window, "forward") == 2 * 2 * 4 * 128 * 14368


def test_flash_window_keeps_the_same_activations_and_parameters():
    full = trace_layer(MODEL, tensor_model_parallel_size=1, micro_batch_size=2)
    window = trace_window_layer(MODEL, tensor_model_parallel_size=1, micro_batch_size=2)
    assert window.activation_bytes == full.activation_bytes and window.param_count == full.param_count


def test_unfused_attention_ignores_the_window_in_cost():
    unfused = MODEL.replace(attention_backend="unfused")
    full = trace_layer(unfused, tensor_model_parallel_size=1, micro_batch_size=2)
    window = trace_window_layer(unfused, tensor_model_parallel_size=1, micro_batch_size=2)
    assert sum(o.flops for o in window.forward) == sum(o.flops for o in full.forward)
