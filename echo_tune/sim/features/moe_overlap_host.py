"""The host's floor under a layer pair of the EP overlap.

Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``; NVIDIA/Megatron-LM d98e8a64ddf3
pipeline_parallel/combined_1f1b.py, models/common/model_chunk_schedule_plan.py ``TransformerLayerSchedulePlan.run``)
runs the forward of one micro-batch and the backward of another layer by layer from the one Python thread of
the rank: every kernel of both passes is issued by the same host, one after the other, onto the compute and
communication streams. The overlap shortens the pair's GPU time (the EP all-to-alls hidden behind the other
pass's compute, ``sim/features/moe_overlap.py``) but not the time the host takes to issue the pair's kernels, so a pair
ends no earlier than

    host time of the forward's kernels + host time of the backward's kernels

(``cost/host/host_bound.py``: the host time per kernel ``ClusterProfile.host_time_per_kernel_s`` for each kernel
issued from Python, the C++ launch for each quantisation kernel; ``sim/schedule/costing.py host_issue_s``).

Each pass is first timed alone with its own wait on the host, against its serial GPU time, in which the EP
all-to-alls count as GPU work the host runs ahead of; the overlap then takes the hidden all-to-all time off
the pass: time in which the host was issuing kernels. ``with_pair_host_floor`` puts the floor back: when the
pair's two passes, with the overlap's change, come to less than the host's issue time of their kernels, the
difference is added as compute (the GPU idle, waiting on the host), split between the two passes by their
host time. It is a lower bound: the forward's synchronisation at the dispatch (the host waits for the router's
token counts before the all-to-all, moe/token_dispatcher.py) can only add to it. NVIDIA's own account of the
schedule says the same (Megatron-LM docs/discussions/deepseek-v3-gb200-optimization/
deepseek-v3-gb200-optimization.md at eb0783b6d3, section 3.2: the 1F1B all-to-all overlap "divides the forward
and backward into multiple stages for scheduling, and there is some synchronization between different
stages, which aggravates the CPU overhead"). With h = 0 (no host time fitted) nothing changes.
"""

from __future__ import annotations

from echo_tune.sim.schedule.costing import CostContext, PhaseCost, host_issue_s
from echo_tune.workload.graph import Trace


def pair_host_wait_s(host_forward_s: float, host_backward_s: float, pair_s: float) -> float:
    """What a layer pair of ``pair_s`` (its two passes with the overlap's change) waits on the host that
    takes ``host_forward_s + host_backward_s`` to issue its kernels."""
    return max(0.0, host_forward_s + host_backward_s - pair_s)


def with_pair_host_floor(trace: Trace, ctx: CostContext, forward: PhaseCost, backward: PhaseCost,
                         deltas: tuple[PhaseCost, PhaseCost], piece: str = "moe_layer",
                         host_s: tuple[float, float] | None = None) -> tuple[PhaseCost, PhaseCost]:
    """The EP overlap's change to one MoE layer's (forward, backward) pass, ``deltas``, with the host's floor
    under the pair added (``forward`` / ``backward``: the passes as timed alone, with their own host wait).
    ``host_s``: ``host_issue_s`` of the trace's forward and backward, where the caller has them already."""
    if ctx.profile.host_time_per_kernel_s <= 0.0:
        return deltas
    h_fwd, h_bwd = host_s or (host_issue_s(trace.forward, ctx, piece=piece),
                              host_issue_s(trace.backward, ctx, piece=piece))
    pair_s = forward.total_s + backward.total_s + deltas[0].total_s + deltas[1].total_s
    wait = pair_host_wait_s(h_fwd, h_bwd, pair_s)
    if wait <= 0.0:
        return deltas
    share = h_fwd / (h_fwd + h_bwd)
    return (deltas[0] + PhaseCost(compute_s=wait * share), deltas[1] + PhaseCost(compute_s=wait * (1.0 - share)))
