"""Partial rotary, squared relu, unfused activation/RoPE kernels, fused cross-entropy, attention sinks."""

from echo_tune.config.specs.model import ModelSpec
from echo_tune.sim.outputs.flops import model_flops_per_step
from echo_tune.workload.tracer import trace_layer, trace_output

S, B, H, HEADS = 128, 2, 64, 4  # d = 16
BASE = ModelSpec(num_layers=2, hidden_size=H, num_attention_heads=HEADS, seq_length=S, vocab_size=1000,
                 make_vocab_size_divisible_by=8, position_embedding_type="rope", hidden_dropout=0.0,
                 attention_dropout=0.0, add_bias_linear=False)


def _layer(model, **kw):
    return trace_layer(model, tensor_model_parallel_size=1, micro_batch_size=B, **kw)


def _ops(trace, region, name):
    return [op for op in trace.forward if op.region == region and name in op.name]


def test_partial_rotary_table_and_fused_kernel_bytes_by_hand():
    trace = _layer(BASE.replace(rotary_percent=0.5))
    ropes = _ops(trace, "qkv", "rope_partial")
    assert len(ropes) == 2
    # query: in + out [s, b, 4 heads, 16] bf16 = 2 * 128*2*4*16*2 = 65536; table [s,1,1,8] fp32 = 4096
    assert ropes[0].bytes == 65536 + 128 * 8 * 4


def test_unfused_rope_runs_more_kernels_than_fused():
    fused, unfused = _layer(BASE), _layer(BASE.replace(apply_rope_fusion=False))
    count = lambda t: sum(1 for op in t.forward + t.backward if op.region == "qkv" and op.kind == "memory")
    assert count(unfused) > count(fused)
    assert not _ops(unfused, "qkv", "echo_tune.rope")


def test_squared_relu_kernels_and_megatron_flops():
    relu2, gelu = BASE.replace(squared_relu=True), BASE
    trace = _layer(relu2)
    names = [op.name for op in trace.forward if op.region == "mlp" and op.kind == "memory"]
    assert names == ["aten.relu", "aten.pow"]
    # Megatron counts a non-gated MLP as 2 GEMMs of h x ffn whatever the activation: 6 * 2 * h * 4h per token
    assert model_flops_per_step(relu2, 8) == model_flops_per_step(gelu, 8)
    gemm = sum(op.flops for op in trace.forward if op.region == "mlp" and op.kind == "gemm")
    assert gemm == 2 * (2 * S * B * H * 4 * H)  # fc1 + fc2 forward, by hand


def test_unfused_swiglu_keeps_silu_output():
    fused = _layer(BASE.replace(swiglu=True))
    unfused = _layer(BASE.replace(swiglu=True, bias_swiglu_fusion=False))
    f = BASE.replace(swiglu=True).ffn_size
    # unfused glu keeps silu(x_glu) [s, b, f] bf16 besides fc1's output: + s * b * f * 2 bytes
    assert unfused.activation_bytes - fused.activation_bytes == S * B * f * 2


def test_cross_entropy_fusion_keeps_one_logits_sized_tensor_and_moves_fewer_bytes():
    tp, v = 2, 1008 // 2  # vocab 1000 padded to 1008 (a multiple of 8 x 2)
    traces = {impl: trace_output(BASE.replace(cross_entropy_loss_fusion=impl is not None,
                                              cross_entropy_fusion_impl=impl or "native"),
                                 tensor_model_parallel_size=tp, micro_batch_size=B) for impl in (None, "native", "te")}
    # unfused and native keep one fp32 [s, b, v/tp] tensor (4 * 128 * 2 * 504 = 516096 bytes), TE (v2.2-v2.17)
    # the gradient in the bf16 logits' own storage (2 bytes per logit); the unfused one also keeps the bool
    # "outside" mask and int64 local labels [s, b], native the int64 labels only, TE neither: differences
    # s*b = 256 and 9*s*b + 2*s*b*v = 260352 bytes, by hand
    assert traces[None].activation_bytes - traces["native"].activation_bytes == S * B
    assert traces[None].activation_bytes - traces["te"].activation_bytes == 9 * S * B + 2 * S * B * v
    # TE's backward scales the bf16 gradient in place and returns it: no cast
    assert [op.name for op in traces["te"].backward if op.name.startswith("echo_tune.te_")] == \
        ["echo_tune.te_element_mul"]
    assert not [op for op in traces["te"].backward if op.name == "aten._to_copy" and op.region == "output"]
    assert traces[None].activation_bytes >= 4 * S * B * v
    moved = {k: sum(op.bytes for op in t.forward + t.backward if op.kind == "memory") for k, t in traces.items()}
    assert moved["te"] < moved["native"] < moved[None]


def test_learnable_sinks_run_fused_unless_window_and_dropout():
    sinks = BASE.replace(softmax_type="learnable", num_layers=4)
    assert sinks.flash_attention
    assert not sinks.replace(window_size=(31, 0), attention_dropout=0.1).flash_attention
    params = _layer(sinks).param_count - _layer(BASE).param_count
    assert params == HEADS


def test_fused_bias_gelu_and_bias_dropout_add_are_one_kernel_each():
    biased = BASE.replace(add_bias_linear=True, hidden_dropout=0.1)
    fused = _layer(biased)
    unfused = _layer(biased.replace(bias_gelu_fusion=False, bias_dropout_fusion=False))
    kernels = lambda t, region: [op.name for op in t.forward if op.region == region and op.kind == "memory"]
    assert kernels(fused, "mlp") == ["echo_tune.bias_gelu"]
    assert kernels(unfused, "mlp") == ["aten.add", "aten.gelu"]
    assert kernels(fused, "mlp_residual") == ["echo_tune.bias_dropout_add"]
    assert kernels(unfused, "mlp_residual") == ["aten.add", "aten.native_dropout", "aten.add"]
    # the same tensors are kept: gelu's input (x, or x + bias) and the 1-byte dropout mask
    assert fused.activation_bytes == unfused.activation_bytes
    # fused residual: reads x, bias, residual, writes out and the mask: [s, b, h] bf16 x 3 + h bf16 + 1-byte mask
    bda = next(op for op in fused.forward if op.name == "echo_tune.bias_dropout_add" and op.region == "mlp_residual")
    assert bda.bytes == 3 * S * B * H * 2 + H * 2 + S * B * H
