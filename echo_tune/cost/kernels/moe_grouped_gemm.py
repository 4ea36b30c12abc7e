"""The MoE experts' grouped GEMM as Megatron-LM runs it: one GEMM per local expert.

echo-tune traces the local experts of ``--moe-grouped-gemm`` as one batched matmul (``torch.bmm`` over the
E/EP experts, ``workload/mlp/moe.py``), and the tracer folds the batch into m. That shape is not what runs:

- Megatron-LM d98e8a64ddf3 ``moe/experts.py`` ``TEGroupedMLP`` builds fc1 / fc2 from TE's
  ``GroupedLinear`` (``TEColumnParallelGroupedLinear`` / ``TERowParallelGroupedLinear``), called with
  ``m_splits = tokens_per_expert``: the tokens are split per expert on the host.
- TE's ``GroupedLinear`` runs ``general_grouped_gemm``, a loop of one cuBLAS GEMM per expert spread over a
  few CUDA streams ("Grouped GEMM via multi-stream cuBLAS", NVIDIA/TransformerEngine PR 853, the
  implementation TE's grouped linear kept through 2.x; a single-kernel cuBLASLt grouped GEMM for FP8
  per-tensor scaling was still an open TE issue in December 2025, NVIDIA/TransformerEngine issue 2452).
- Under FP8, ``GroupedLinear`` quantises its input with ``tex.split_quantize`` (one quantiser per expert),
  and the backward quantises the output gradient the same way: one quantisation kernel per expert.

So each expert's GEMM has m = its own rows (forward and dgrad: the tokens it received; wgrad: its input
width), which the efficiency surface's saturation g(m) sees (``cost/kernels/compute.py``): a grouped GEMM of 64
rows per expert runs at g(64) = 1/3 of a large one, where the folded shape said ~1. Each expert GEMM and
each per-expert quantisation is its own kernel launch. FLOPs and bytes are split evenly over the experts
(balanced routing, the workload's own assumption; ``moe_routing_imbalance`` already sized the rows).
A measured op (``echo-tune profile`` op-time database) keeps its measured time.

With ``--use-transformer-engine-op-fuser`` and ``--moe-grouped-gemm`` Megatron-LM d98e8a64 builds the experts from
TE's operation-based ``GroupedLinear`` over a GroupedTensor (moe/experts.py ``_with_fused_impl``, TE >= 2.14;
transformer_config.py turns ``moe_use_grouped_tensor`` on): one grouped GEMM kernel over all local experts, whose
tiles the GPU schedules together, and one quantisation kernel for the group. It is costed as the traced shape
folds it (m = all experts' rows) with one launch (``MoEKernels.grouped_single_kernel``, sim/schedule/costing.py). Not
modelled: the 256-row alignment each expert's tokens are padded to on that path (moe_utils.py
``get_align_size_for_quantization``; none where an expert's rows are a multiple of 256, as balanced routing of
power-of-two batches gives).
"""

from __future__ import annotations

import dataclasses

from echo_tune.workload.graph import Op

GROUPED_REGION = ("moe", "experts")
"""Where the traced bmm is TE's per-expert GroupedLinear (region, subregion)."""


def is_grouped_expert_gemm(op: Op) -> bool:
    """A local-experts GEMM traced as one bmm over more than one expert."""
    return op.kind == "gemm" and (op.region, op.subregion) == GROUPED_REGION and op.gemm_groups > 1


def per_expert_op(op: Op) -> Op:
    """One expert's share of a grouped GEMM: m, FLOPs and bytes divided by the number of experts."""
    groups = op.gemm_groups
    m, n, k = op.gemm_mnk
    return dataclasses.replace(op, flops=op.flops / groups, bytes=op.bytes / groups,
                               gemm_mnk=(max(1, m // groups), n, k), gemm_groups=1)
