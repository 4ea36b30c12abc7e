"""The traced pieces of a layout and the cost of one forward / backward pass of each."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.collectives.moe_dispatch import MoEKernels
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.costing import ZERO, CostContext, PhaseCost, phase_cost, phase_cost_and_host_s
from echo_tune.sim.features.determinism import deterministic_attention_model
from echo_tune.sim.schedule import trace_cache
from echo_tune.identity_cache import IdentityCache
from echo_tune.sim.schedule.linear_layers import linear_deltas
from echo_tune.sim.features.moe_overlap import ep_overlap_deltas, shared_overlap_costs
from echo_tune.sim.features.moe_overlap_host import with_pair_host_floor
from echo_tune.workload.graph import Trace

# Traced pieces by (model, shape): filled by tracing (which imports torch) or by ``seed_pieces`` with
# pieces traced elsewhere (a parallel search traces once and hands them to its workers).
_PIECES: dict[tuple, dict[str, Trace]] = {}
_COSTS = IdentityCache()


def _trace_kwargs(parallel: ParallelConfig, layout: Layout) -> dict:
    """Everything the tracer is told about the layout (and so everything a trace is cached on)."""
    return dict(tensor_model_parallel_size=parallel.tensor_model_parallel_size,
                context_parallel_size=parallel.context_parallel_size,
                sequence_parallel=layout.sequence_parallel, micro_batch_size=parallel.micro_batch_size,
                precision=parallel.precision, expert_model_parallel_size=parallel.expert_model_parallel_size,
                expert_tensor_parallel_size=parallel.expert_tensor_size, cp_comm=layout.cp_comm,
                deterministic=parallel.deterministic_mode)


def pieces_key(model: ModelSpec, parallel: ParallelConfig, layout: Layout) -> tuple:
    return (model, *sorted(_trace_kwargs(parallel, layout).items()))


def seed_pieces(pieces: dict[tuple, dict[str, Trace]]) -> None:
    """Make pieces traced in another process available here (keys from ``pieces_key``)."""
    _PIECES.update(pieces)


def on_disk(model: ModelSpec, parallel: ParallelConfig, layout: Layout) -> bool:
    """Whether ``trace_pieces`` in another process finds this layout's pieces in the trace cache on disk (so a
    parallel search need not send them with every batch)."""
    model = deterministic_attention_model(model, parallel)
    return trace_cache.stored(pieces_key(model, parallel, layout))


def trace_pieces(model: ModelSpec, parallel: ParallelConfig, layout: Layout) -> dict[str, Trace]:
    """The layer, embedding and output pieces one rank runs (cached by shape; torch loads on a miss)."""
    model = deterministic_attention_model(model, parallel)  # the attention TE runs under deterministic mode
    key = pieces_key(model, parallel, layout)
    if key in _PIECES:
        return _PIECES[key]
    stored = trace_cache.load(key)
    if stored is not None:
        _PIECES[key] = stored
        return stored
    # lazy: loads torch (~1.5 s to import), which importing sim.passes does not
    from echo_tune.workload.tracer import (trace_embedding, trace_layer, trace_linear_layer, trace_moe_layer,
                                           trace_output, trace_window_layer)

    kwargs = _trace_kwargs(parallel, layout)
    ep, etp = kwargs.pop("expert_model_parallel_size"), kwargs.pop("expert_tensor_parallel_size")
    attention = {"cp_comm": kwargs.pop("cp_comm")}  # how the layers' attention talks across CP
    kwargs.pop("deterministic")  # the gated delta net's path only (below)
    try:
        pieces = {"layer": trace_layer(model, **kwargs, **attention), "embedding": trace_embedding(model, **kwargs),
                  "output": trace_output(model, **kwargs)}
        if model.is_moe:
            pieces["moe_layer"] = trace_moe_layer(model, **kwargs, **attention, expert_model_parallel_size=ep,
                                                  expert_tensor_parallel_size=etp)
        if model.windowed_attention:  # the layers with a sliding window (sim/schedule/layer_mix.py says which)
            pieces["window_layer"] = trace_window_layer(model, **kwargs, **attention)
            if model.is_moe:
                pieces["moe_window_layer"] = trace_window_layer(model, **kwargs, **attention, expert_model_parallel_size=ep,
                                                                expert_tensor_parallel_size=etp, moe=True)
        if model.linear_attention:  # the gated delta net layers (sim/schedule/linear_layers.py says which)
            linear = dict(deterministic=parallel.deterministic_mode)
            pieces["linear_layer"] = trace_linear_layer(model, **kwargs, **linear)
            if model.is_moe:
                pieces["moe_linear_layer"] = trace_linear_layer(model, **kwargs, **linear, moe=True,
                                                                expert_model_parallel_size=ep,
                                                                expert_tensor_parallel_size=etp)
    except RuntimeError as exc:  # torch: a tensor of more than 2**63 bytes (issue 10: never a traceback)
        if "overflow" not in str(exc):
            raise
        raise ConfigError(f"the layout's tensors overflow 64-bit sizes (micro_batch_size={parallel.micro_batch_size}, "
                          f"seq_length={model.seq_length}, hidden_size={model.hidden_size}); lower micro_batch_size "
                          f"or seq_length") from None
    _PIECES[key] = pieces
    trace_cache.save(key, pieces)
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
    window: dict[str, PhaseCost] | None = None
    """Sliding-window layers: (window piece - full piece) cost of "forward", "backward" and
    "selective_recompute", dense and ("moe_" prefixed) MoE; None without a window."""
    linear: dict[str, PhaseCost] | None = None
    """Gated-delta-net layers: (linear piece - full piece) costs as ``window`` (sim/schedule/linear_layers.py)."""
    moe_ep_overlap_forward: PhaseCost = ZERO
    """Change to one MoE layer's forward when it runs paired under the EP overlap (sim/features/moe_overlap.py)."""
    moe_ep_overlap_backward: PhaseCost = ZERO


def _replayed(trace: Trace, ctx: CostContext, regions: tuple[str, ...]) -> PhaseCost:
    """Forward cost of the regions selective recompute replays."""
    return sum((phase_cost(trace.forward, ctx, region=r, piece=trace.piece) for r in regions), ZERO)


def pass_costs(pieces: dict[str, Trace], ctx: CostContext,
               regions: tuple[str, ...] = ("core_attention",)) -> PassCosts:
    """Costs of the pieces' passes (cached: layouts differing only in PP, DP or schedule share them).
    ``regions``: the traced regions selective recompute replays.

    Cached in two parts on every field of ``ctx``: the passes, and what depends on ``regions`` too (the
    replayed forward, and the sliding-window and gated-delta-net deltas whole), so that layouts differing only
    in their recompute modules cost the passes once (71 batches of the Qwen3-235B-A22B recipe space: 2,859
    pass costs, at most 1,307 passes)."""
    traces = tuple(pieces[name] for name in ("layer", "embedding", "output", "moe_layer", "window_layer",
                                             "moe_window_layer", "linear_layer", "moe_linear_layer") if name in pieces)
    groups = _COSTS.get(traces, ("groups",), lambda: sorted({op.group for t in traces for op in t.forward + t.backward
                                                              if op.kind == "collective"}))
    objects, extra = list(traces), []
    for f in dataclasses.fields(ctx):  # every field of the context, so a new one is never left out
        value = getattr(ctx, f.name)
        if f.name == "groups":  # only the groups the pieces' collectives run on
            extra.append(tuple((g, value[g]) for g in groups))
        elif isinstance(value, (str, int, float, bool, type(None), MoEKernels)):  # MoEKernels: frozen, hashable
            extra.append(value)
        else:
            objects.append(value)
    objects = tuple(objects)
    passes = _COSTS.get(objects, (*extra, "passes"), lambda: _pass_costs(pieces, ctx))
    return _COSTS.get(objects, (*extra, tuple(regions)), lambda: _with_regions(passes, pieces, ctx, regions))


def _with_regions(passes: dict[str, PhaseCost], pieces: dict[str, Trace], ctx: CostContext,
                  regions: tuple[str, ...]) -> PassCosts:
    """``passes`` (``_pass_costs``) with the costs that depend on the replayed ``regions``."""
    moe = dict(moe_selective_recompute=_replayed(pieces["moe_layer"], ctx, regions)) if "moe_layer" in pieces else {}
    window = None
    if "window_layer" in pieces:
        window = {}
        for prefix, full in (("", "layer"), ("moe_", "moe_layer")):
            if f"{prefix}window_layer" not in pieces:
                continue
            w, f = pieces[f"{prefix}window_layer"], pieces[full]
            window[f"{prefix}forward"] = phase_cost(w.forward, ctx) + phase_cost(f.forward, ctx).scaled(-1)
            window[f"{prefix}backward"] = phase_cost(w.backward, ctx) + phase_cost(f.backward, ctx).scaled(-1)
            window[f"{prefix}selective_recompute"] = _replayed(w, ctx, regions) + _replayed(f, ctx, regions).scaled(-1)
    return PassCosts(**passes, **moe, window=window, linear=linear_deltas(pieces, ctx, regions, _replayed),
                     selective_recompute=_replayed(pieces["layer"], ctx, regions))


def _pass_costs(pieces: dict[str, Trace], ctx: CostContext) -> dict[str, PhaseCost]:
    """The fields of ``PassCosts`` that do not depend on the replayed regions."""
    layer = pieces["layer"]
    moe = {}
    if "moe_layer" in pieces:
        t = pieces["moe_layer"]
        fwd_bwd = (phase_cost_and_host_s(t.forward, ctx, piece="moe_layer"),
                   phase_cost_and_host_s(t.backward, ctx, piece="moe_layer"))
        fwd, bwd = fwd_bwd[0][0], fwd_bwd[1][0]
        if ctx.moe is not None and ctx.moe.shared_expert_overlap:
            fwd, bwd = shared_overlap_costs(t, ctx, fwd, bwd)
        moe = dict(moe_layer_forward=fwd, moe_layer_backward=bwd)
        if ctx.overlap_moe_expert_parallel_comm:
            deltas = ep_overlap_deltas(t, ctx, ctx.delay_wgrad_compute)
            # one host issues both passes of a pair: the overlap cannot end it before their kernels are issued
            # (the host time counted by the passes' own pass over their ops: ``host_issue_s``)
            moe["moe_ep_overlap_forward"], moe["moe_ep_overlap_backward"] = with_pair_host_floor(
                t, ctx, fwd, bwd, deltas, host_s=(fwd_bwd[0][1], fwd_bwd[1][1]))
    return dict(**moe,
                layer_forward=phase_cost(layer.forward, ctx, piece="layer"),
                layer_backward=phase_cost(layer.backward, ctx, piece="layer"),
                embedding_forward=phase_cost(pieces["embedding"].forward, ctx, piece="embedding"),
                embedding_backward=phase_cost(pieces["embedding"].backward, ctx, piece="embedding"),
                output_forward=phase_cost(pieces["output"].forward, ctx, piece="output"),
                output_backward=phase_cost(pieces["output"].backward, ctx, piece="output"))
