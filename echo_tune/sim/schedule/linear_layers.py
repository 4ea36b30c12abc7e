"""The layers that run the gated delta net in place of self-attention (``--experimental-attention-variant gdn``).

``model.linear_attention_pattern`` (``--linear-attention-freq``; config/specs/linear_attention_fields.py) says which of the
global layers they are; the traced "linear_layer" / "moe_linear_layer" pieces (workload/attention/gated_delta_net.py) are those
layers with a dense or MoE MLP. Like the sliding-window layers (sim/schedule/layer_mix.py), a chunk is costed from its
self-attention layers' pieces plus, per gated-delta-net layer, the difference (linear piece - attention piece):
time (``linear_deltas``, added by chunk_passes.window_passes), parameters, weight-gradient tensors and activation
bytes (``linear_param_delta``, ``linear_activation_delta``), so every layer-count path (DP gradients, optimizer
states, pipeline memory) sees the layers as they are.
"""

from __future__ import annotations

from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.sim.schedule.costing import PhaseCost, phase_cost
from echo_tune.sim.schedule.layer_mix import chunk_pattern_mix

PIECES = (("", "layer", "linear_layer"), ("moe_", "moe_layer", "moe_linear_layer"))
"""(prefix, the self-attention piece, the gated-delta-net piece) for dense and MoE layers."""


def chunk_linear_mix(model: ModelSpec, layout: Layout) -> tuple[tuple[tuple[int, int], ...], ...]:
    """(dense, MoE) gated-delta-net layers of every chunk of every stage (all 0 without them). MTP layers are
    self-attention layers (config/specs/linear_attention_fields.py refuses MTP beside the gated delta net)."""
    return chunk_pattern_mix(model.linear_attention_pattern if model.linear_attention else None, model.moe_pattern,
                             layout)


def linear_deltas(pieces: dict, ctx, regions: tuple[str, ...], replayed) -> dict[str, PhaseCost] | None:
    """(gated delta net - self-attention) cost of one layer's "forward", "backward" and "selective_recompute",
    dense and ("moe_" prefixed) MoE; None without gated-delta-net pieces. ``replayed(trace, ctx, regions)``: the
    forward cost of the regions selective recompute replays (sim/schedule/passes.py)."""
    out: dict[str, PhaseCost] = {}
    for prefix, full, linear in PIECES:
        if linear not in pieces:
            continue
        la, f = pieces[linear], pieces[full]
        out[f"{prefix}forward"] = phase_cost(la.forward, ctx, piece=linear) + \
            phase_cost(f.forward, ctx, piece=full).scaled(-1)
        out[f"{prefix}backward"] = phase_cost(la.backward, ctx, piece=linear) + \
            phase_cost(f.backward, ctx, piece=full).scaled(-1)
        out[f"{prefix}selective_recompute"] = replayed(la, ctx, regions) + replayed(f, ctx, regions).scaled(-1)
    return out or None


def linear_param_delta(pieces: dict, linear: tuple[int, int]) -> tuple[int, int]:
    """(parameters, linear weight tensors) that a chunk's (dense, MoE) gated-delta-net layers hold beyond as many
    self-attention layers (``Trace.param_count``, ``Trace.linear_param_counts``)."""
    params = tensors = 0
    for (_, full, piece), count in zip(PIECES, linear):
        if count and piece in pieces:
            params += count * (pieces[piece].param_count - pieces[full].param_count)
            tensors += count * (len(pieces[piece].linear_param_counts) - len(pieces[full].linear_param_counts))
    return params, tensors


def linear_activation_delta(pieces: dict, layout: Layout, linear: tuple[int, int], layers: int, fp8_saved: dict,
                            activation_bytes) -> tuple[float, float]:
    """(bytes kept per micro-batch beyond the self-attention layers', transient recompute bytes of one layer) of a
    chunk of ``layers`` layers whose (dense, MoE) ``linear`` are gated delta nets. ``activation_bytes``:
    sim/memory/stage.py ``layer_activation_bytes``; ``fp8_saved``: bytes per layer FP8 saves, by piece."""
    kept = extra = 0.0
    for (_, full, piece), count in zip(PIECES, linear):
        if not count or piece not in pieces:
            continue
        if layout.recompute_granularity == "full":  # every layer keeps its input (the same bytes); the one
            extra = max(extra, activation_bytes(pieces[piece], layout, 1)[1])  # recomputed at a time grows
            continue
        kept += count * (activation_bytes(pieces[piece], layout, 1)[0] - fp8_saved.get(piece, 0.0)
                         - activation_bytes(pieces[full], layout, 1)[0] + fp8_saved.get(full, 0.0))
    return kept, extra


def linear_notes(model: ModelSpec, deterministic: bool) -> tuple[str, ...]:
    if not model.linear_attention:
        return ()
    path = ("Megatron's torch-native chunked delta rule (--deterministic-mode), traced op by op" if deterministic
            else "FLA's chunk_gated_delta_rule, one kernel each way, FLOPs by its chunked algorithm and timed at the "
                 "fused-attention efficiency")
    return (f"gated delta net on {sum(model.linear_attention_pattern)} of {model.num_layers} layers "
            f"(--linear-attention-freq {model.linear_attention_freq}): {path}",)
