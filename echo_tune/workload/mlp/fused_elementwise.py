"""Megatron's jit-fused elementwise kernels: bias + GeLU, and bias + dropout + residual add.

Megatron-LM d98e8a64ddf3:
- core/fusions/fused_bias_gelu.py ``bias_gelu_impl`` (``bias_activation_fusion``, default on; off with
  ``--no-bias-gelu-fusion``): one kernel y = gelu(x + bias) (tanh approximation), keeping x and the bias;
  backward one kernel for the input gradient, whose broadcast sum gives the bias gradient.
- core/fusions/fused_bias_dropout.py ``bias_dropout_add_fused_train`` (``bias_dropout_fusion``, default on;
  off with ``--no-bias-dropout-fusion``): torch.compile fuses ``residual + dropout(x + bias)`` into one
  kernel that also writes the 1-byte dropout mask (kept for backward); backward one kernel scales the
  gradient by the mask (the residual's gradient passes through). Without a bias and with p = 0 both paths
  are one residual add (torch's dropout returns its input at p = 0), traced as that add.
Unfused (the flags off): layers.py traces the separate torch ops Megatron then runs.
"""

from __future__ import annotations

import torch

from echo_tune.workload.recording import kernels

bias_gelu = kernels._define("bias_gelu", "(Tensor x, Tensor bias) -> Tensor", lambda x, b: torch.empty_like(x))
bias_gelu_backward = kernels._define("bias_gelu_backward", "(Tensor dy, Tensor x, Tensor bias) -> Tensor",
                                     lambda dy, x, b: torch.empty_like(x))


def _gelu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _gelu_backward(ctx, dy):
    x, bias = ctx.saved_tensors
    dx = torch.ops.echo_tune.bias_gelu_backward(dy, x, bias)
    return dx, dx.reshape(-1, dx.shape[-1]).sum(0)


bias_gelu.register_autograd(_gelu_backward, setup_context=_gelu_setup)

bda = kernels._define("bias_dropout_add", "(Tensor x, Tensor? bias, Tensor residual, float p) -> (Tensor, Tensor)",
                      lambda x, b, r, p: (torch.empty_like(r), torch.empty_like(x, dtype=torch.bool)))
bda_backward = kernels._define("bias_dropout_add_backward", "(Tensor dy, Tensor mask, float p) -> Tensor",
                               lambda dy, mask, p: torch.empty_like(dy))


def _bda_setup(ctx, inputs, output):
    ctx.set_materialize_grads(False)
    ctx.mark_non_differentiable(output[1])
    # at p = 0 torch's dropout returns its input: the compiled kernel is bias + residual add, no mask kept
    ctx.save_for_backward(output[1] if inputs[3] > 0 else None)
    ctx.p, ctx.has_bias = inputs[3], inputs[1] is not None


def _bda_backward(ctx, dy, _dmask):
    (mask,) = ctx.saved_tensors
    dx = torch.ops.echo_tune.bias_dropout_add_backward(dy, mask, ctx.p) if mask is not None else dy
    dbias = dx.reshape(-1, dx.shape[-1]).sum(0) if ctx.has_bias else None
    return dx, dbias, dy, None


bda.register_autograd(_bda_backward, setup_context=_bda_setup)


def fused_bias_dropout_add(x, bias, residual, p: float) -> torch.Tensor:
    """residual + dropout(x + bias) as one kernel (see the module docstring)."""
    return torch.ops.echo_tune.bias_dropout_add(x, bias, residual, p)[0]


# real kernels (``echo-tune profile`` / ``emulate``)
def _gelu_real(x, b):
    return torch.nn.functional.gelu(x + b, approximate="tanh")


def _gelu_backward_real(dy, x, b):
    # aten's own GeLU backward kernel (what autograd runs for gelu): autograd.grad cannot record here, the op
    # runs below the autograd dispatch key (the backward of a custom op)
    xb = (x + b).float()
    return torch.ops.aten.gelu_backward(dy.float(), xb, approximate="tanh").to(x.dtype)


def _bda_real(x, b, r, p):
    x = x + b if b is not None else x
    mask = torch.rand_like(x, dtype=torch.float32) >= p
    return r + x * mask / (1 - p), mask


for _op, _impl in ((bias_gelu, _gelu_real), (bias_gelu_backward, _gelu_backward_real), (bda, _bda_real),
                   (bda_backward, lambda dy, mask, p: dy * mask / (1 - p))):
    _op.register_kernel(("cpu", "cuda"), _impl)
