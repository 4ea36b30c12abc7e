"""Megatron's jit-fused elementwise kernels: bias + GeLU, quick-GeGLU, and bias + dropout + residual add.

Megatron-LM d98e8a64ddf3:
- core/fusions/fused_bias_gelu.py ``bias_gelu_impl`` (``bias_activation_fusion``, default on; off with
  ``--no-bias-gelu-fusion``): one kernel y = gelu(x + bias) (tanh approximation), keeping x and the bias;
  backward one kernel for the input gradient, whose broadcast sum gives the bias gradient.
- core/fusions/fused_bias_dropout.py ``bias_dropout_add_fused_train`` (``bias_dropout_fusion``, default on;
  off with ``--no-bias-dropout-fusion``): torch.compile fuses ``residual + dropout(x + bias)`` into one
  kernel that also writes the 1-byte dropout mask (kept for backward); backward one kernel scales the
  gradient by the mask (the residual's gradient passes through). Without a bias and with p = 0 both paths
  are one residual add (torch's dropout returns its input at p = 0), traced as that add.
- core/fusions/fused_bias_geglu.py ``weighted_quick_geglu`` (the experts' ``weighted_bias_quick_geglu_impl``,
  ``--quick-geglu`` with bias_activation_fusion): one jit-fused kernel y = quick_gelu(x1) * (x2 + offset) over
  [rows, 2f], saving its input; backward one kernel (``weighted_quick_geglu_back``). The routing probabilities
  ride in the same kernels (moe.py ``SideGradient``).
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

quick_geglu = kernels._define("quick_geglu", "(Tensor x, float offset) -> Tensor",
                              lambda x, o: x.new_empty((*x.shape[:-1], x.shape[-1] // 2)))
quick_geglu_backward = kernels._define("quick_geglu_backward", "(Tensor dy, Tensor x, float offset) -> Tensor",
                                       lambda dy, x, o: torch.empty_like(x))


def _qgeglu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.offset = inputs[1]


def _qgeglu_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return torch.ops.echo_tune.quick_geglu_backward(dy, x, ctx.offset), None


quick_geglu.register_autograd(_qgeglu_backward, setup_context=_qgeglu_setup)

# ``weighted_bias_quick_geglu_impl`` builds its offset as ``torch.tensor(linear_offset, dtype, device=input.device)``
# on every call: a copy from pageable host memory that the host waits for (cost/host/host_bound.py). Traced as this
# op, on a scalar of the input's dtype and device (``like``), so the cost layer sees where the queue empties.
host_scalar_to_device = kernels._define("host_scalar_to_device", "(Tensor like, float value) -> Tensor",
                                        lambda like, v: torch.empty_like(like))

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


def _qgeglu_real(x, offset):
    a, b = x.chunk(2, dim=-1)
    return a * torch.sigmoid(1.702 * a) * (b + offset)  # fused_bias_geglu.py quick_gelu(a) * (b + offset)


def _qgeglu_backward_real(dy, x, offset):
    a, b = x.float().chunk(2, dim=-1)
    sig = torch.sigmoid(1.702 * a)
    da = dy.float() * (b + offset) * (sig + 1.702 * a * sig * (1 - sig))
    return torch.cat([da, dy.float() * a * sig], dim=-1).to(x.dtype)


def _bda_real(x, b, r, p):
    x = x + b if b is not None else x
    mask = torch.rand_like(x, dtype=torch.float32) >= p
    return r + x * mask / (1 - p), mask


for _op, _impl in ((bias_gelu, _gelu_real), (bias_gelu_backward, _gelu_backward_real), (bda, _bda_real),
                   (quick_geglu, _qgeglu_real), (quick_geglu_backward, _qgeglu_backward_real),
                   (host_scalar_to_device, lambda like, v: torch.tensor(v, dtype=like.dtype, device=like.device)),
                   (bda_backward, lambda dy, mask, p: dy * mask / (1 - p))):
    _op.register_kernel(("cpu", "cuda"), _impl)
