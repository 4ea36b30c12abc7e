"""The traced pieces of a layout and the cost of one forward / backward pass of each."""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.compatibility import Layout
from echo_tune.config.model import ModelSpec
from echo_tune.config.parallel import ParallelConfig
from echo_tune.sim.costing import ZERO, CostContext, PhaseCost, phase_cost
from echo_tune.workload import trace_embedding, trace_layer, trace_moe_layer, trace_output
from echo_tune.workload.graph import Trace


def trace_pieces(model: ModelSpec, parallel: ParallelConfig, layout: Layout) -> dict[str, Trace]:
    """The layer, embedding and output pieces one rank runs (cached by shape in the tracer)."""
    kwargs = dict(tensor_model_parallel_size=parallel.tensor_model_parallel_size,
                  context_parallel_size=parallel.context_parallel_size,
                  sequence_parallel=layout.sequence_parallel, micro_batch_size=parallel.micro_batch_size,
                  precision=parallel.precision)
    pieces = {"layer": trace_layer(model, **kwargs), "embedding": trace_embedding(model, **kwargs),
              "output": trace_output(model, **kwargs)}
    if model.is_moe:
        pieces["moe_layer"] = trace_moe_layer(model, **kwargs,
                                              expert_model_parallel_size=parallel.expert_model_parallel_size,
                                              expert_tensor_parallel_size=parallel.expert_tensor_size)
    return pieces


@dataclass(frozen=True, kw_only=True)
class PassCosts:
    layer_forward: PhaseCost
    layer_backward: PhaseCost
    selective_recompute: PhaseCost
    embedding_forward: PhaseCost
    embedding_backward: PhaseCost
    output_forward: PhaseCost
    output_backward: PhaseCost
    moe_layer_forward: PhaseCost = ZERO
    moe_layer_backward: PhaseCost = ZERO
    moe_selective_recompute: PhaseCost = ZERO
    mtp_heads: int = 0
    """Extra output heads on the last stage (multi-token prediction)."""


def _replayed(trace: Trace, ctx: CostContext, regions: tuple[str, ...]) -> PhaseCost:
    """Forward cost of the regions selective recompute replays."""
    return sum((phase_cost(trace.forward, ctx, region=r) for r in regions), ZERO)


def pass_costs(pieces: dict[str, Trace], ctx: CostContext,
               regions: tuple[str, ...] = ("core_attention",)) -> PassCosts:
    layer = pieces["layer"]
    moe = {}
    if "moe_layer" in pieces:
        t = pieces["moe_layer"]
        moe = dict(moe_layer_forward=phase_cost(t.forward, ctx), moe_layer_backward=phase_cost(t.backward, ctx),
                   moe_selective_recompute=_replayed(t, ctx, regions))
    return PassCosts(**moe,
        layer_forward=phase_cost(layer.forward, ctx), layer_backward=phase_cost(layer.backward, ctx),
        selective_recompute=_replayed(layer, ctx, regions),
        embedding_forward=phase_cost(pieces["embedding"].forward, ctx),
        embedding_backward=phase_cost(pieces["embedding"].backward, ctx),
        output_forward=phase_cost(pieces["output"].forward, ctx),
        output_backward=phase_cost(pieces["output"].backward, ctx))
