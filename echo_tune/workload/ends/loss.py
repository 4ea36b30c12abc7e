"""The fused vocabulary-parallel cross-entropy (``--cross-entropy-loss-fusion``), as fused kernels.

Each implementation keeps one [s, b, v/tp] tensor for backward: ``native`` an fp32 softmax (4 bytes per logit,
as heads.py's unfused path), ``te`` the logits' gradient in the logits' own bf16 storage (2 bytes per logit).

- ``native`` (Megatron-LM d98e8a64ddf3 core/fusions/fused_cross_entropy.py, jit-fused with
  torch.compile): kernel 1 casts the bf16 logits to fp32 and takes the row max (reads 2, writes 4 bytes
  per logit); all-reduce(max) over TP; kernel 2 subtracts the max, exponentiates and sums and picks the
  target logit (reads 4, writes 4); one all-reduce of [predicted; sum_exp] ([2s, b] fp32); kernel 3
  divides by the sum (reads 4, writes 4), kept as the softmax. Backward: one kernel subtracts 1 at the
  target, scales by the loss gradient and writes the bf16 logits gradient (reads 4, writes 2).
- ``te`` (TransformerEngine v2.2-v2.17, e.g. v2.10 ``pytorch/triton/cross_entropy.py`` and
  ``common/triton/cross_entropy.py``, what every published run of 2025-26 ran): an online-softmax kernel
  reads the bf16 logits once (2 bytes) into per-row (max, sum, target logit), all-gathered over TP ([3 s b]
  fp32 per rank); a second kernel reads the logits again and writes the loss and the gradient over them, in
  place in their dtype (2 + 2), saved for backward. Backward: ``element_mul_kernel`` scales it by the loss
  gradient in place (2 + 2) and returns it: no cast. TE v2.18 (PR 3193, 2026-07-09) writes the gradient to a
  new fp32 tensor instead (2 + 4 forward, 4 + 4 and an fp32 -> bf16 cast backward, 4 bytes per logit kept);
  not modelled: a run on TE >= 2.18 keeps ~2 bytes per logit more than predicted and moves ~8 more.
The unfused path (heads.py) reads/writes the fp32 copy about twice as often (cast, max, sub, exp,
sum, div forward; scatter, mul, cast backward).
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from echo_tune.workload.recording import kernels
from echo_tune.workload.recording.comm import all_reduce
from echo_tune.workload.recording.context import record_collective

_f32 = torch.float32
ce_max = kernels._define("ce_logits_max", "(Tensor logits) -> (Tensor, Tensor)",
                         lambda x: (x.new_empty(x.shape, dtype=_f32), x.new_empty(x.shape[:-1], dtype=_f32)))
ce_exp = kernels._define("ce_exp_sum", "(Tensor logits, Tensor max, Tensor labels) -> (Tensor, Tensor)",
                         lambda x, m, y: (torch.empty_like(x), x.new_empty((2 * x.shape[0], *x.shape[1:-1]))))
ce_norm = kernels._define("ce_normalize", "(Tensor exp, Tensor pred_sum) -> (Tensor, Tensor)",
                          lambda e, ps: (torch.empty_like(e), e.new_empty(e.shape[:-1])))
ce_grad = kernels._define("ce_grad", "(Tensor softmax, Tensor grad_loss, Tensor labels, ScalarType dtype) -> Tensor",
                          lambda p, g, y, dtype: p.new_empty(p.shape, dtype=dtype))
te_online = kernels._define("te_online_softmax", "(Tensor logits, Tensor labels) -> Tensor",
                            lambda x, y: x.new_empty((3 * x.shape[:-1].numel(),), dtype=_f32))
te_ce = kernels._define("te_cross_entropy", "(Tensor logits, Tensor labels, Tensor mdxy) -> (Tensor, Tensor)",
                        lambda x, y, s: (x.new_empty(x.shape[:-1], dtype=_f32), torch.empty_like(x)))
te_mul = kernels._define("te_element_mul", "(Tensor grad, Tensor grad_loss) -> Tensor",
                         lambda g, gl: torch.empty_like(g))


class _NativeFused(Function):
    @staticmethod
    def forward(ctx, logits, labels, tp):
        logits32, row_max = torch.ops.echo_tune.ce_logits_max(logits)
        all_reduce(row_max, "tp", tp)
        exp, pred_sum = torch.ops.echo_tune.ce_exp_sum(logits32, row_max, labels)
        all_reduce(pred_sum, "tp", tp)
        softmax, loss = torch.ops.echo_tune.ce_normalize(exp, pred_sum)
        ctx.save_for_backward(softmax, labels)
        ctx.dtype = logits.dtype
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, labels = ctx.saved_tensors
        return torch.ops.echo_tune.ce_grad(softmax, grad_loss, labels, ctx.dtype), None, None


class _TEFused(Function):
    @staticmethod
    def forward(ctx, logits, labels, tp):
        mdxy = torch.ops.echo_tune.te_online_softmax(logits, labels)
        record_collective("all_gather", "tp", mdxy.numel() * mdxy.element_size() * tp, tp)
        gathered = mdxy.new_empty((mdxy.shape[0] * tp,)) if tp > 1 else mdxy
        loss, grad = torch.ops.echo_tune.te_cross_entropy(logits, labels, gathered)
        ctx.save_for_backward(grad)  # the logits' storage, overwritten with their gradient
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        return torch.ops.echo_tune.te_element_mul(grad, grad_loss), None, None


def fused_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, tp: int, impl: str) -> torch.Tensor:
    """Per-token losses [s, b] (fp32) from this rank's logits [s, b, v/tp] by the fused ``impl``."""
    return (_TEFused if impl == "te" else _NativeFused).apply(logits, labels, tp)


# real kernels (``echo-tune profile`` / ``emulate``): the same outputs from torch ops, tp = 1
def _max_real(x):
    x32 = x.float()
    return x32, x32.amax(-1)


def _exp_real(x, m, y):
    shifted = x - m.unsqueeze(-1)
    pred = torch.gather(shifted, -1, y.clamp(0, x.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    exp = shifted.exp()
    return exp, torch.cat((pred, exp.sum(-1)))


def _norm_real(e, ps):
    pred, sum_exp = ps.chunk(2)
    return e / sum_exp.unsqueeze(-1), torch.log(sum_exp) - pred


def _grad_real(p, g, y, dtype):
    grad = p.clone()
    grad.scatter_add_(-1, y.clamp(0, p.shape[-1] - 1).unsqueeze(-1), -torch.ones_like(g).unsqueeze(-1))
    return (grad * g.unsqueeze(-1)).to(dtype)


def _online_real(x, y):
    x32 = x.float()
    m = x32.amax(-1)
    d = (x32 - m.unsqueeze(-1)).exp().sum(-1)
    xy = torch.gather(x32, -1, y.clamp(0, x.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    return torch.cat((m.flatten(), d.flatten(), xy.flatten()))


def _te_ce_real(x, y, mdxy):
    n = x.shape[:-1].numel()
    m, d, xy = (t.view(x.shape[:-1]) for t in mdxy[:3 * n].chunk(3))
    softmax = (x.float() - m.unsqueeze(-1)).exp() / d.unsqueeze(-1)
    grad = softmax.scatter_add(-1, y.clamp(0, x.shape[-1] - 1).unsqueeze(-1), -torch.ones_like(m).unsqueeze(-1))
    return torch.log(d) + m - xy, grad.to(x.dtype)


for _op, _impl in ((ce_max, _max_real), (ce_exp, _exp_real), (ce_norm, _norm_real), (ce_grad, _grad_real),
                   (te_online, _online_real), (te_ce, _te_ce_real),
                   (te_mul, lambda g, gl: (g * gl.unsqueeze(-1)).to(g.dtype))):
    _op.register_kernel(("cpu", "cuda"), _impl)
