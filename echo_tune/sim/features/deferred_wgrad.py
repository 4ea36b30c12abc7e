"""``--defer-embedding-wgrad-compute`` / ``--wgrad-deferral-limit``: the last stage's output-layer wgrad GEMMs
moved from each micro-batch's backward to the pipeline flush.

Megatron-LM d98e8a64ddf3: in core/tensor_parallel/layers.py the output layer's forward appends its input
to ``embedding_activation_buffer`` and LinearWithGradAccumulationAndAsyncCommunication.backward appends
``grad_output`` to ``grad_output_buffer`` instead of running the wgrad GEMM (and, with sequence
parallelism, the all-gather of the input that GEMM needs), while fewer than ``wgrad_deferral_limit``
micro-batches are buffered (0 = all of them). After the last backward, before the gradients are finalized,
``finish_embedding_wgrad_compute`` (pipeline_parallel/schedules.py) runs ``drain_embedding_wgrad_compute``
(core/utils.py): the first all-gather synchronously, then each GEMM beside the next input's all-gather
(double-buffered), so D deferred micro-batches take ``ag + (D - 1) * max(w, ag) + w`` (``D * w`` without
sequence parallelism).

Each deferred backward of the last chunk of the last stage is shorter by w (+ ag): the stages upstream,
waiting on the last stage's backward gradients, get them sooner. The engine times one backward per
(stage, chunk), so with a limit D < m the saving is spread evenly over the m backward passes (D / m of it
on each): the total work and the drain are exact, the timing of each pass is an average.

Memory: each deferred micro-batch keeps its output-layer input and its logits gradient [tokens, vocab / TP]
(bf16) until the drain; they are added to the last stage's activation peak (an upper bound: the first
buffers are filled after the warm-up's peak).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from echo_tune.sim.schedule.costing import ZERO, CostContext, PhaseCost, phase_cost
from echo_tune.workload.graph import Trace

GRAD_OUTPUT_BYTES_PER_ELEMENT = 2  # the logits gradient in bf16 (the output layer's activation dtype)


@dataclass(frozen=True, kw_only=True)
class DeferredWgrad:
    deferred_micro_batches: int
    saved_per_backward: PhaseCost
    """What leaves the last chunk's backward of one deferred micro-batch: the wgrad GEMM (+ the all-gather of
    its input), as the backward's cost with them less its cost without them."""
    drain: PhaseCost
    """The flush: all deferred GEMMs (and all-gathers) after the last backward."""
    buffer_bytes: float
    """Bytes the deferred micro-batches keep until the drain."""


def _wgrad_ops(output: Trace):
    """(the output layer's wgrad GEMM, the all-gather of its input or None) in the output piece's backward.

    The forward logits GEMM is (tokens, vocab / TP, hidden); its wgrad is (vocab / TP, hidden, tokens)."""
    fwd = next(op for op in output.forward if op.kind == "gemm")
    m, n, k = fwd.gemm_mnk
    wgrad = next(op for op in output.backward if op.kind == "gemm" and op.gemm_mnk == (n, k, m))
    gather = next((op for op in output.backward if op.kind == "collective" and op.collective == "all_gather"
                   and op.group == "tp"), None)
    return wgrad, gather


def deferred_wgrad(output: Trace, ctx: CostContext, num_micro_batches: int, limit: int) -> DeferredWgrad:
    """The deferral of one step of ``num_micro_batches`` micro-batches with ``--wgrad-deferral-limit limit``."""
    d = num_micro_batches if limit == 0 else min(limit, num_micro_batches)
    wgrad, gather = _wgrad_ops(output)
    w = phase_cost((wgrad,), ctx, piece="output")
    ag = phase_cost((gather,), ctx, piece="output") if gather is not None else ZERO
    # what a deferred backward no longer holds: in it the all-gather ran beside the dgrad GEMM and the dgrad
    # reduction beside the wgrad GEMM (cost/tp_overlap.async_pairs), so the saving is the backward with them
    # less the backward without them (whose dgrad reduction then has no GEMM beside it), not w + ag alone
    kept = tuple(op for op in output.backward if op is not wgrad and op is not gather)
    saved = phase_cost(output.backward, ctx, piece="output") + phase_cost(kept, ctx, piece="output").scaled(-1)
    drain_s = ag.total_s + (d - 1) * max(w.total_s, ag.total_s) + w.total_s if gather is not None else d * w.total_s
    compute_s = d * w.compute_s
    drain = PhaseCost(compute_s=compute_s, comm_exposed_s=max(0.0, drain_s - compute_s))
    m, _, k = wgrad.gemm_mnk
    buffers = d * (output.input_bytes + m * k * GRAD_OUTPUT_BYTES_PER_ELEMENT)
    return DeferredWgrad(deferred_micro_batches=d, saved_per_backward=saved, drain=drain, buffer_bytes=buffers)


def with_deferral(passes: list, defer: DeferredWgrad, num_micro_batches: int) -> list:
    """``passes[stage][chunk]`` = (forward, backward, recompute) with the last chunk of the last stage's backward
    shortened by the deferred share of its wgrad (see the module docstring)."""
    fwd, bwd, rec = passes[-1][-1]
    share = defer.deferred_micro_batches / num_micro_batches
    last = passes[-1][:-1] + [(fwd, bwd + defer.saved_per_backward.scaled(-share), rec)]
    return passes[:-1] + [last]


def with_buffers(memory: tuple, defer: DeferredWgrad) -> tuple:
    """The stages' memory with the deferred micro-batches' buffers on the last stage's activations."""
    last = memory[-1]
    return memory[:-1] + (dataclasses.replace(last, activations_bytes=last.activations_bytes
                                              + int(defer.buffer_bytes)),)
