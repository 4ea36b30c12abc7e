"""The fused elementwise kernels run for real (``emulate`` / ``profile``) and give torch's gradients."""

import torch

import echo_tune.workload.mlp.fused_elementwise  # noqa: F401  (registers the ops)


def test_bias_gelu_runs_forward_and_backward_with_torchs_gradients():
    # the backward op runs below autograd (a custom op's backward): it once called autograd.grad there and
    # raised "element 0 of tensors does not require grad" in every emulate of a GPT-style (bias + GeLU) model
    torch.manual_seed(0)
    x = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(5, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(6, 5, dtype=torch.float64)
    torch.ops.echo_tune.bias_gelu(x, b).backward(dy)
    x2, b2 = x.detach().clone().requires_grad_(True), b.detach().clone().requires_grad_(True)
    torch.nn.functional.gelu(x2 + b2, approximate="tanh").backward(dy)
    assert torch.allclose(x.grad, x2.grad) and torch.allclose(b.grad, b2.grad)


def test_quick_geglu_runs_forward_and_backward_with_torchs_gradients():
    # Megatron's quick_gelu(x1) * (x2 + offset) (core/fusions/fused_bias_geglu.py), offset 1 as GPT-OSS
    torch.manual_seed(0)
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(6, 4, dtype=torch.float64)
    torch.ops.echo_tune.quick_geglu(x, 1.0).backward(dy)
    x2 = x.detach().clone().requires_grad_(True)
    a, b = x2.chunk(2, dim=-1)
    (a * torch.sigmoid(1.702 * a) * (b + 1.0)).backward(dy)
    assert torch.allclose(x.grad, x2.grad)
