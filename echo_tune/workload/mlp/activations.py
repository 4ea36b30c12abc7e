"""The MLP activation between fc1 and fc2, fused or as Megatron's separate kernels.

Megatron-LM d98e8a64ddf3 core/transformer/mlp.py ``MLP.forward``: with ``bias_activation_fusion``
(``--no-bias-gelu-fusion`` / ``--no-bias-swiglu-fusion`` turn it off; training/argument_utils.py picks
the swiglu or the gelu switch) the fc1 bias, if any, and the activation run as one jit-fused kernel
(bias_gelu_impl / bias_swiglu_impl): ``echo_tune::bias_gelu`` (fused_elementwise.py), or for SwiGLU the
bias added by the fc1 linear (comm.py, its own add kernel: an upper bound) and ``echo_tune::swiglu``. Unfused: ``x + bias`` (when there
is a bias) as its own kernel, then the activation: GeLU one kernel; SwiGLU as ``glu``: chunk, silu,
multiply (two kernels, and silu's output is kept for backward); ``--squared-relu`` is
core/activations.py ``squared_relu`` = ``torch.pow(F.relu(x), 2)`` (two kernels; Megatron has no fused
variant: TransformerConfig refuses bias_activation_fusion with it, so it is never fused).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import echo_tune.workload.mlp.fused_elementwise  # noqa: F401  (registers echo_tune::bias_gelu)


def fc1_fuses_bias(model) -> bool:
    """Whether the fc1 bias rides in the fc1 linear: a fused SwiGLU (its bias add is traced there)."""
    return model.swiglu and model.bias_swiglu_fusion


def activation(hidden: torch.Tensor, bias: torch.Tensor | None, model) -> torch.Tensor:
    """The activation of fc1's output [..., ffn] (or [..., 2 ffn] gated); ``bias``: fc1's, not yet added."""
    if bias is not None and not model.swiglu and not model.squared_relu and model.bias_gelu_fusion:
        return torch.ops.echo_tune.bias_gelu(hidden, bias)  # one kernel (fused_elementwise.py)
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
