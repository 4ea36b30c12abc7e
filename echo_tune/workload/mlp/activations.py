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

``--quick-geglu`` (GPT-OSS), quick_gelu(x1) * (x2 + glu_linear_offset) with quick_gelu(x) = x * sigmoid(1.702 x):
fused only in the experts (``experts_quick_geglu``); unfused, ``glu``'s torch ops: the clamps
(``activation_func_clamp_value``), quick_gelu's three kernels (scale, sigmoid, multiply), the offset add and
the product.
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
    if model.quick_geglu:
        return _glu(hidden, model)
    if model.squared_relu:
        return torch.pow(F.relu(hidden), 2)
    return F.gelu(hidden, approximate="tanh")


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)  # core/fusions/fused_bias_geglu.py quick_gelu


def _clamped_halves(hidden: torch.Tensor, model) -> tuple[torch.Tensor, torch.Tensor]:
    x_glu, x_linear = torch.chunk(hidden, 2, dim=-1)
    if (v := model.activation_func_clamp_value) is not None:
        x_glu, x_linear = x_glu.clamp(max=v), x_linear.clamp(min=-v, max=v)
    return x_glu, x_linear


def _glu(hidden: torch.Tensor, model) -> torch.Tensor:
    """Megatron's unfused ``glu`` (mlp.py / experts.py ``bias_act_func`` at d98e8a64ddf3) for quick-GeGLU."""
    x_glu, x_linear = _clamped_halves(hidden, model)
    return _quick_gelu(x_glu) * (x_linear + model.glu_linear_offset)


def experts_quick_geglu(hidden: torch.Tensor, model) -> torch.Tensor:
    """The experts' fused quick-GeGLU (experts.py ``bias_act_func`` -> ``weighted_bias_quick_geglu_impl``,
    core/fusions/fused_bias_geglu.py at d98e8a64ddf3): with a clamp, the two clamped halves are first written
    back into one tensor (``torch.cat``: two clamp kernels and a copy over [rows, 2f], and autograd keeps the
    clamps' input besides the fused kernel's), then ``torch.tensor(linear_offset, device=...)``, a copy the host
    waits for (``host_scalar_to_device``), then one jit-fused kernel. The probability weighting rides in it
    (moe.py)."""
    if model.activation_func_clamp_value is not None:
        hidden = torch.cat(_clamped_halves(hidden, model), dim=-1)
    torch.ops.echo_tune.host_scalar_to_device(hidden.new_empty(()), float(model.glu_linear_offset))  # a host sync
    return torch.ops.echo_tune.quick_geglu(hidden, float(model.glu_linear_offset))
