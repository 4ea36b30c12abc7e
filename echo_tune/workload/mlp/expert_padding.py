"""The experts' quantisation padding: TE's ``Fp8Padding`` / ``Fp8Unpadding`` around the grouped GEMMs.

Megatron-LM d98e8a64ddf3 ``moe/experts.py`` ``TEGroupedMLP.forward``: under ``config.fp8`` or ``config.fp4``, unless
the tokens arrive padded already (``moe_utils.skip_routed_expert_padding``: router padding for quantisation, the
HybridEP / NCCL-EP dispatchers), each expert's rows are padded to the recipe's alignment (16 rows for FP8, 32 for
MXFP8) before fc1, the probabilities with them, and the fc2 output unpadded after the bias. TE's ``Fp8Padding``
(``module/fp8_padding.py``) returns its input when every expert's row count is already aligned; else it allocates
the padded tensor and copies every row into it (``tex.fused_multi_row_padding``), and its backward copies the
gradient back (``fused_multi_row_unpadding``); ``Fp8Unpadding`` the reverse. Megatron's forced load balancing routes
by random logits (``moe_utils.apply_random_logits``), so the counts are not aligned: the copies run every micro-batch.
With drop-and-pad every expert holds its capacity, a multiple of the alignment for the published layouts: no copy.

Traced as one ``echo_tune::expert_pad`` op per padding or unpadding, forward and backward, each reading and writing
its tensor, in sub-region "expert_pad"; the trace does not know the precision, so the cost layer times them only
under FP8 / FP4 with a dispatcher that leaves them to the experts (``sim/schedule/costing.py`` ``_pads``,
``MoEKernels.experts_pad``)."""

from __future__ import annotations

import torch

from echo_tune.workload.recording import kernels

expert_pad = kernels._define("expert_pad", "(Tensor x) -> Tensor", lambda x: torch.empty_like(x))
expert_pad.register_kernel(("cpu", "cuda"), lambda x: x.clone())  # a real run (``emulate``): the copy


class _Padded(torch.autograd.Function):
    """One padding (or unpadding) copy forward and one of the gradient backward, the tensor passed on unchanged: the
    copies are timed, while the tensors the experts save stay those the dispatcher made (the padded ones are the
    same size), as the activation-memory and offload accounting by region expects (workload/tracer.py)."""

    @staticmethod
    def forward(ctx, x):
        torch.ops.echo_tune.expert_pad(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        torch.ops.echo_tune.expert_pad(dy)
        return dy


def padded(x: torch.Tensor) -> torch.Tensor:
    """``x`` through one padding (or unpadding) copy."""
    return _Padded.apply(x)
