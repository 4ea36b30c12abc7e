"""The attention output gate (``--attention-output-gate``): a sigmoid gate on the core-attention output.

Megatron-LM d98e8a64ddf3 core/transformer/attention.py:
- ``SelfAttention.__init__``: the QKV projection gets ``kv_channels x num_attention_heads`` more output columns
  (``linear_qkv_out_dim``), per query group laid out as [q (np/ng heads), gate (np/ng heads), k, v]
  (``get_query_key_value_tensors``: ``num_qkv_heads_per_group += num_query_heads_per_group``), so the gate has
  the query's shape;
- ``Attention.forward``: ``core_attn_out = _apply_output_gate(core_attn_out, gate)`` before ``linear_proj``,
  where ``_apply_output_gate`` is ``@jit_fuser`` (torch.compile): ``x * sigmoid(gate.float())`` cast back,
  one fused elementwise kernel forward, one backward (dx and dgate), saving x and the gate.
The gate's FLOPs count in Megatron's ``num_floating_point_operations`` (training/training.py
``gate_projection_size``; sim/outputs/flops.py). Megatron refuses it with MLA (transformer_config.py, MLATransformerConfig).
"""

from __future__ import annotations

import torch

from echo_tune.workload.recording import kernels

output_gate = kernels._define("output_gate", "(Tensor x, Tensor gate) -> Tensor", lambda x, g: torch.empty_like(x))
output_gate_backward = kernels._define("output_gate_backward", "(Tensor dy, Tensor x, Tensor gate) -> (Tensor, Tensor)",
                                       lambda dy, x, g: (torch.empty_like(x), torch.empty_like(g)))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, dy):
    x, gate = ctx.saved_tensors
    return tuple(torch.ops.echo_tune.output_gate_backward(dy, x, gate))


output_gate.register_autograd(_backward, setup_context=_setup)


def apply_output_gate(context: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``context * sigmoid(gate)``, one fused kernel; ``gate`` is viewed as the context's shape."""
    return torch.ops.echo_tune.output_gate(context, gate.reshape(context.shape))


# real kernels (``echo-tune profile`` / ``emulate``): the math in at least fp32, as the fused kernel does
def _up(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _real(x, gate):
    return (_up(x) * torch.sigmoid(_up(gate))).to(x.dtype)


def _backward_real(dy, x, gate):
    s = torch.sigmoid(_up(gate))
    return (_up(dy) * s).to(x.dtype), (_up(dy) * _up(x) * s * (1 - s)).to(gate.dtype)


for _op, _impl in ((output_gate, _real), (output_gate_backward, _backward_real)):
    _op.register_kernel(("cpu", "cuda"), _impl)
