"""The traced pieces of a layout and the cost of one forward / backward pass of each."""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.compatibility import Layout
from echo_tune.config.model import ModelSpec
from echo_tune.config.parallel import ParallelConfig
from echo_tune.sim.costing import CostContext, PhaseCost, phase_cost
from echo_tune.workload import trace_embedding, trace_layer, trace_output
from echo_tune.workload.graph import Trace


def trace_pieces(model: ModelSpec, parallel: ParallelConfig, layout: Layout) -> dict[str, Trace]:
    """The layer, embedding and output pieces one rank runs (cached by shape in the tracer)."""
    kwargs = dict(tensor_model_parallel_size=parallel.tensor_model_parallel_size,
                  context_parallel_size=parallel.context_parallel_size,
                  sequence_parallel=layout.sequence_parallel, micro_batch_size=parallel.micro_batch_size,
                  precision=parallel.precision)
    return {"layer": trace_layer(model, **kwargs), "embedding": trace_embedding(model, **kwargs),
            "output": trace_output(model, **kwargs)}


@dataclass(frozen=True, kw_only=True)
class PassCosts:
    layer_forward: PhaseCost
    layer_backward: PhaseCost
    selective_recompute: PhaseCost
    embedding_forward: PhaseCost
    embedding_backward: PhaseCost
    output_forward: PhaseCost
    output_backward: PhaseCost


def pass_costs(pieces: dict[str, Trace], ctx: CostContext) -> PassCosts:
    layer = pieces["layer"]
    return PassCosts(
        layer_forward=phase_cost(layer.forward, ctx), layer_backward=phase_cost(layer.backward, ctx),
        selective_recompute=phase_cost(layer.forward, ctx, region="core_attention"),
        embedding_forward=phase_cost(pieces["embedding"].forward, ctx),
        embedding_backward=phase_cost(pieces["embedding"].backward, ctx),
        output_forward=phase_cost(pieces["output"].forward, ctx),
        output_backward=phase_cost(pieces["output"].backward, ctx))
