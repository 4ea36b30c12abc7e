"""The real CPU implementations of the echo_tune:: kernels compute what they claim (and their gradients)."""

import math

import pytest
import torch

import echo_tune.workload.recording.kernels_real as kr

ops = torch.ops.echo_tune


def _reference_attention(q, k, v, heads):
    k, v = k.repeat_interleave(heads // k.shape[2], 2), v.repeat_interleave(heads // v.shape[2], 2)
    out = torch.nn.functional.scaled_dot_product_attention(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3),
                                                           v.permute(1, 2, 0, 3), is_causal=True)
    return out.permute(2, 0, 1, 3)


def test_flash_attention_matches_sdpa_with_grouped_query_heads():
    torch.manual_seed(0)
    s, b, heads, groups, d = 16, 2, 4, 2, 8
    q = torch.randn(s, b, heads, d, requires_grad=True)
    k, v = (torch.randn(s, b, groups, d, requires_grad=True) for _ in range(2))
    out, lse = ops.flash_attn(q, k, v, True, 1 / math.sqrt(d))
    ref = _reference_attention(q, k, v, heads)
    assert out.shape == q.shape and lse.shape == (b, heads, s) and lse.dtype == torch.float32
    torch.testing.assert_close(out, ref)
    grad = torch.randn_like(out)
    for mine, theirs in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(mine, theirs)


def test_math_attention_path_matches_the_flash_kernel():
    torch.manual_seed(1)
    s, b, heads, d = 8, 1, 2, 4
    q, k, v = (torch.randn(s, b, heads, d) for _ in range(3))
    out, lse = ops.flash_attn(q, k, v, False, 0.5)
    qb, kb, vb = (kr._bhsd(t, heads) for t in (q, k, v))
    m_out, m_lse = kr._math_forward(qb, kb, vb, False, 0.5)
    torch.testing.assert_close(m_out.permute(2, 0, 1, 3), out)
    torch.testing.assert_close(m_lse, lse)
    dout = torch.randn_like(out)
    flash = ops.flash_attn_backward(dout, q, k, v, out, lse, False, 0.5)
    math_grads = kr._math_backward(kr._bhsd(dout, heads), qb, kb, vb, kr._bhsd(out, heads), lse, False, 0.5)
    for a, b_ in zip(flash, math_grads):
        torch.testing.assert_close(a, kr._fold(b_, heads))


@pytest.mark.parametrize("name", ["swiglu", "rms_norm", "rope", "softmax"])
def test_fused_kernels_pass_gradcheck(name):
    torch.manual_seed(2)
    x = torch.randn(3, 2, 8, dtype=torch.double, requires_grad=True)
    if name == "swiglu":
        fn, inputs = ops.swiglu, (x,)
    elif name == "rms_norm":
        fn, inputs = (lambda x, w: ops.rms_norm(x, w, 1e-5)[0]), (x, torch.randn(8, dtype=torch.double,
                                                                                 requires_grad=True))
    elif name == "rope":
        freqs = torch.randn(3, 1, 8, dtype=torch.double)
        fn, inputs = (lambda t: ops.rope(t, freqs)), (x,)
    else:
        fn, inputs = (lambda t: ops.scaled_upper_triang_masked_softmax(t, 0.5)), (torch.randn(
            2, 4, 4, dtype=torch.double, requires_grad=True),)
    assert torch.autograd.gradcheck(fn, inputs, check_undefined_grad=False)  # kernels.py: never undefined


def test_flash_attention_with_a_narrower_value_head_matches_the_math_path():
    # MLA: q/k head size 192, v 128 in DeepSeek-V3; torch's flash kernels need one size (emulate and profile of
    # such a model raised "Q/K/V should have the same head size")
    torch.manual_seed(2)
    s, b, heads, d, dv = 8, 2, 2, 12, 8
    q, k = (torch.randn(s, b, heads, d, requires_grad=True) for _ in range(2))
    v = torch.randn(s, b, heads, dv, requires_grad=True)
    out, lse = ops.flash_attn(q, k, v, True, 0.3)
    assert out.shape == (s, b, heads, dv)
    m_out, m_lse = kr._math_forward(*(kr._bhsd(t, heads) for t in (q, k, v)), True, 0.3)
    torch.testing.assert_close(out, m_out.permute(2, 0, 1, 3))
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    qb, kb, vb = (kr._bhsd(t.detach(), heads) for t in (q, k, v))
    ref = kr._math_backward(kr._bhsd(dout, heads), qb, kb, vb, kr._bhsd(out.detach(), heads), lse, True, 0.3)
    for mine, theirs in zip(grads, ref):
        assert mine.shape == theirs.permute(2, 0, 1, 3).shape
        torch.testing.assert_close(mine, kr._fold(theirs, heads))
