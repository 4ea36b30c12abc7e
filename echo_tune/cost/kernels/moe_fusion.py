"""Megatron-Core's fused MoE kernels: ``--moe-router-fusion`` and ``--moe-permute-fusion``.

Without them the router's scoring (softmax / sigmoid, top-k, the aux-loss scores) and the token permutation
(gather of the top-k copies, sort by local expert, un-permute weighted by the probabilities, scatter-add) are
chains of memory-bound PyTorch kernels, which the tracer records one by one (workload/mlp/moe.py). With them,
Transformer Engine runs each chain as one kernel (megatron/core/transformer/moe/moe_utils.py
``fused_topk_with_score_function`` / ``fused_permute`` / ``fused_unpermute`` / ``fused_sort_chunks_by_index``,
NVIDIA/Megatron-LM commit d98e8a64ddf3): one launch, and the intermediate tensors never go through HBM.

Modelled: each maximal run of consecutive memory-bound ops of a fused sub-region (the router's three chains TE
fuses, ``workload.graph.ROUTER_FUSED_CHAINS``; "dispatch" and "combine" for permutation) becomes one kernel whose
bytes are those of the run's largest op (a fused kernel reads the chain's input and writes its output once, which
the largest member already does). A run stops at a GEMM, a collective or an op of another sub-region, so the
router's kernels TE does not fuse (random logits, z-loss, the aux loss's count and logging: sub-region "router")
stay kernels of their own.
"""

from __future__ import annotations

import dataclasses

from echo_tune.workload.graph import ROUTER_FUSED_CHAINS, Op

ROUTER_SUBREGIONS = ROUTER_FUSED_CHAINS
PERMUTE_SUBREGIONS = ("dispatch", "combine")


def fused_subregions(router_fusion: bool, permute_fusion: bool) -> str:
    """The sub-regions whose memory-bound chains are fused, as a comma list (a cache-friendly context value)."""
    return ",".join((ROUTER_SUBREGIONS if router_fusion else ()) + (PERMUTE_SUBREGIONS if permute_fusion else ()))


def fuse_memory_runs(ops: tuple[Op, ...], subregions: str) -> tuple[Op, ...]:
    """``ops`` with each run of consecutive memory ops of a fused MoE sub-region replaced by one op."""
    fused = set(subregions.split(",")) - {""}
    if not fused:
        return ops
    out: list[Op] = []
    run: list[Op] = []

    def flush():
        if len(run) == 1:
            out.append(run[0])
        elif run:
            biggest = max(run, key=lambda op: op.bytes)
            out.append(dataclasses.replace(biggest, name=f"fused_{run[0].subregion}", key=""))
        run.clear()

    for op in ops:
        if op.kind == "memory" and op.region == "moe" and op.subregion in fused and \
                (not run or run[-1].subregion == op.subregion):
            run.append(op)
            continue
        flush()
        if op.kind == "memory" and op.region == "moe" and op.subregion in fused:
            run.append(op)
        else:
            out.append(op)
    flush()
    return tuple(out)
