"""The MLP activation between fc1 and fc2, fused or as Megatron's separate kernels.

Megatron-LM d98e8a64ddf3 core/transformer/mlp.py ``MLP.forward``: with ``bias_activation_fusion``
(``--no-bias-gelu-fusion`` / ``--no-bias-swiglu-fusion`` turn it off; training/argument_utils.py picks
the swiglu or the gelu switch) the fc1 bias, if any, and the activation run as one jit-fused kernel
(bias_gelu_impl / bias_swiglu_impl); here the bias is added by the fc1 linear (comm.py traces it as
its own add kernel, so a biased fused GeLU is costed as the unfused one: ``--no-bias-gelu-fusion``
changes nothing in the trace, an upper bound on the fused kernel) and the activation is one kernel
(GeLU) or the fused ``echo_tune::swiglu``. Unfused: ``x + bias`` (when there
is a bias) as its own kernel, then the activation: GeLU one kernel; SwiGLU as ``glu``: chunk, silu,
multiply (two kernels, and silu's output is kept for backward); ``--squared-relu`` is
core/activations.py ``squared_relu`` = ``torch.pow(F.relu(x), 2)`` (two kernels; Megatron has no fused
variant: TransformerConfig refuses bias_activation_fusion with it, so it is never fused).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import echo_tune.workload.kernels  # noqa: F401  (registers the echo_tune:: ops)


def fc1_fuses_bias(model) -> bool:
    """Whether the fc1 bias and the activation run as one fused kernel (mlp.py bias_activation_fusion)."""
    if model.squared_relu:
        return False
    return model.bias_swiglu_fusion if model.swiglu else model.bias_gelu_fusion


def activation(hidden: torch.Tensor, bias: torch.Tensor | None, model) -> torch.Tensor:
    """The activation of fc1's output [..., ffn] (or [..., 2 ffn] gated); ``bias``: added unfused first."""
    if bias is not None:
        hidden = hidden + bias
    if model.swiglu:
        if model.bias_swiglu_fusion:
            return torch.ops.echo_tune.swiglu(hidden)
        x_glu, x_linear = torch.chunk(hidden, 2, dim=-1)
        return F.silu(x_glu) * x_linear
    if model.squared_relu:
        return torch.pow(F.relu(hidden), 2)
    return F.gelu(hidden, approximate="tanh")
