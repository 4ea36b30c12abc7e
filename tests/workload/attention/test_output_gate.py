"""--attention-output-gate (workload/attention/output_gate.py): the gate's GEMM columns, kernels, saved bytes, FLOPs."""

import pytest
import torch

import echo_tune as et
from echo_tune.errors import ConfigError
from echo_tune.sim.outputs.flops import model_flops_per_step
from echo_tune.workload.attention import output_gate  # noqa: F401  (registers the real kernels)
from echo_tune.workload.tracer import trace_layer

LLAMA8 = et.load_model("llama3-8b")  # h 4096, 32 heads of 128, 8 groups, seq 8192
MIB = 2**20


def _traces():
    plain = trace_layer(LLAMA8, tensor_model_parallel_size=2)
    gated = trace_layer(LLAMA8.replace(attention_output_gate=True), tensor_model_parallel_size=2)
    return plain, gated


def test_gate_adds_query_sized_qkv_columns_and_one_fused_kernel_each_way():
    plain, gated = _traces()
    # TP 2: 16 heads x 128 = 2048 more QKV output columns of 4096 inputs on this rank
    assert gated.param_count - plain.param_count == 2048 * 4096
    qkv = [o.gemm_mnk for o in gated.forward if o.region == "qkv" and o.kind == "gemm"]
    assert qkv == [(8192, (16 + 2 * 4) * 128 + 2048, 4096)]  # tokens x (q + k + v + gate) x h
    ops = [(o.name, o.phase, o.bytes) for o in gated.forward + gated.backward
           if o.region == "output_gate" and o.name.startswith("echo_tune")]
    # gate / context / output: 8192 tokens x 2048 x 2 bytes = 32 MiB each; forward reads x, gate, writes out;
    # backward reads dy, x, gate, writes dx, dgate
    assert ops == [("echo_tune.output_gate", "fwd", 3 * 32 * MIB), ("echo_tune.output_gate_backward", "bwd", 5 * 32 * MIB)]


def test_gate_saved_bytes():
    plain, gated = _traces()
    # kept per micro-batch: the gate's contiguous copy saved by the gate kernel and the gated output saved by
    # the output projection (it used to save the attention output, already kept): 2 x 32 MiB. The QKV output
    # (with the gate's columns) is not kept: TE's attention saves a contiguous copy of v, not the view
    # (workload/attention/core_attention.py te_qkv_layout)
    assert gated.activation_bytes - plain.activation_bytes == 2 * 32 * MIB


def test_gate_counts_in_megatron_flops():
    # training.py gate_projection_size: 6 x tokens x h x (32 x 128) per layer; 16 x 8192 tokens, 32 layers
    delta = model_flops_per_step(LLAMA8.replace(attention_output_gate=True), 16) - model_flops_per_step(LLAMA8, 16)
    assert delta == 6 * 16 * 8192 * 4096 * 4096 * 32


def test_gate_kernels_pass_gradcheck():
    torch.manual_seed(3)
    x, gate = (torch.randn(3, 2, 8, dtype=torch.double, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(torch.ops.echo_tune.output_gate, (x, gate))
    torch.testing.assert_close(torch.ops.echo_tune.output_gate(x, gate), x * torch.sigmoid(gate))


def test_gate_is_refused_with_mla():
    with pytest.raises(ConfigError, match="Output gate is not supported for MLA"):
        et.load_model("deepseek-v2-lite").replace(attention_output_gate=True)


def test_gate_flag_is_read():
    from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
    model, _, _, ignored = parse_megatron_line("--attention-output-gate")
    assert model == {"attention_output_gate": True} and not ignored
    assert "--attention-output-gate" in to_megatron_flags(model, {}, "bf16")
