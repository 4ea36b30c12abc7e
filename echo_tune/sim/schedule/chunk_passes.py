"""One micro-batch's passes of one pipeline chunk: (forward, backward, recompute) as PhaseCosts, from the traced
pieces' costs and what the chunk holds (layers of each kind, embedding, loss, MTP, sliding-window layers)."""

from __future__ import annotations

from echo_tune.config.specs.layout import Layout
from echo_tune.sim.schedule.costing import ZERO, PhaseCost
from echo_tune.sim.schedule.passes import PassCosts


def chunk_passes(layout: Layout, costs: PassCosts, stage: int, chunk: int,
                  mix: tuple[int, int] | None = None, bf16: tuple[PassCosts, int, int] | None = None,
                  per_pass: PhaseCost = ZERO, window: tuple[int, int] | None = None,
                  paired: float = 0.0, linear: tuple[int, int] | None = None) -> tuple[PhaseCost, PhaseCost, PhaseCost]:
    """(forward, backward without recompute, recompute) of one micro-batch of one chunk.

    ``mix`` = (dense layers, MoE layers) of the chunk, MTP layers included (all dense when None). The
    chunk's contents (``Layout.chunk_contents``) add the embedding, and the output layer with the loss
    (one head, plus one per MTP layer). ``bf16``: (bf16 layer costs, layers at the start, layers at the
    end) kept in bf16 under FP8 (``--first-last-layers-bf16``): the model's first and last decoder layers,
    wherever the split puts them (taken as dense layers). ``window``: (dense, MoE) layers of the chunk with
    sliding-window attention (``layer_mix.chunk_window_mix``). ``paired``: the share of the stage's passes that
    the EP overlap pairs (``moe_overlap.paired_fraction``), each MoE layer of them changed by
    ``costs.moe_ep_overlap_*``. ``linear``: (dense, MoE) layers of the chunk with the gated delta net in place of
    self-attention (sim/schedule/linear_layers.py), each changed by ``costs.linear``."""
    contents = layout.chunk_contents[stage][chunk]
    dense, moe = mix or (contents.layers + contents.mtp_layers, 0)
    layers = dense + moe
    fwd = costs.layer_forward.scaled(dense) + costs.moe_layer_forward.scaled(moe)
    bwd = costs.layer_backward.scaled(dense) + costs.moe_layer_backward.scaled(moe)
    if paired and moe:
        fwd = fwd + costs.moe_ep_overlap_forward.scaled(moe * paired)
        bwd = bwd + costs.moe_ep_overlap_backward.scaled(moe * paired)
    if bf16 is not None:
        plain, start, end = bf16
        total = sum(layout.stage_layers)
        lo, hi = contents.first_layer, contents.first_layer + contents.layers
        n = max(0, min(hi, start) - lo) + max(0, hi - max(lo, total - end))
        n = min(n, contents.layers)
        fwd = fwd + plain.layer_forward.scaled(n) + costs.layer_forward.scaled(-n)
        bwd = bwd + plain.layer_backward.scaled(n) + costs.layer_backward.scaled(-n)
    rec = ZERO
    if layout.recompute_granularity == "selective":
        rec = costs.selective_recompute.scaled(dense) + costs.moe_selective_recompute.scaled(moe)
    elif layout.recompute_granularity == "full" and layers:
        recomputed = min(layers, layout.recompute_num_layers) if layout.recompute_method == "block" else layers
        moe_share = moe * recomputed / layers  # block recompute: the first layers; taken pro rata
        rec = costs.layer_forward.scaled(recomputed - moe_share) + costs.moe_layer_forward.scaled(moe_share)
    if window is not None and costs.window:  # sliding-window layers: their attention's cost difference
        fwd, bwd, rec = window_passes(layout, costs.window, (dense, moe), window, (fwd, bwd, rec))
    if linear is not None and costs.linear:  # gated-delta-net layers: their cost difference from self-attention
        fwd, bwd, rec = window_passes(layout, costs.linear, (dense, moe), linear, (fwd, bwd, rec))
    fwd, bwd = fwd + per_pass, bwd + per_pass  # FP8 delayed scaling: the amax all-reduce of each pass
    if contents.embedding:
        fwd, bwd = fwd + costs.embedding_forward, bwd + costs.embedding_backward
    heads = int(contents.loss) + contents.mtp_layers
    if heads:
        fwd, bwd = fwd + costs.output_forward.scaled(heads), bwd + costs.output_backward.scaled(heads)
    return fwd, bwd, rec


def all_chunk_passes(layout: Layout, costs: PassCosts, mix, windows, bf16=None, per_pass: PhaseCost = ZERO,
                     paired: list[float] | None = None,
                     linears=None) -> list[list[tuple[PhaseCost, PhaseCost, PhaseCost]]]:
    """``chunk_passes`` of every (stage, chunk): ``[stage][chunk]``. Chunks that hold the same work (most of
    them: the same layer counts, no embedding or loss) are costed once."""
    p, v = len(layout.stage_chunk_layers), layout.virtual_pipeline_size
    paired = paired or [0.0] * p
    done: dict[tuple, tuple[PhaseCost, PhaseCost, PhaseCost]] = {}
    out = []
    for s in range(p):
        row = []
        for c in range(v):
            contents = layout.chunk_contents[s][c]
            # everything chunk_passes reads of the chunk (where it starts matters only to the bf16 layers)
            key = (contents.layers, contents.mtp_layers, contents.embedding, contents.loss,
                   contents.first_layer if bf16 is not None else 0, mix[s][c], windows[s][c], paired[s],
                   linears[s][c] if linears else None)
            if key not in done:
                done[key] = chunk_passes(layout, costs, s, c, mix[s][c], bf16, per_pass, window=windows[s][c],
                                         paired=paired[s], linear=linears[s][c] if linears else None)
            row.append(done[key])
        out.append(row)
    return out


def window_passes(layout: Layout, delta: dict[str, PhaseCost], mix: tuple[int, int], window: tuple[int, int],
                   passes: tuple[PhaseCost, PhaseCost, PhaseCost]) -> tuple[PhaseCost, PhaseCost, PhaseCost]:
    """Add the (variant - full attention) cost of the chunk's variant layers (a sliding window, or the gated delta
    net) to its (fwd, bwd, recompute)."""
    fwd, bwd, rec = passes
    layers = sum(mix)
    for prefix, count in zip(("", "moe_"), window):
        if not count or f"{prefix}forward" not in delta:
            continue
        fwd = fwd + delta[f"{prefix}forward"].scaled(count)
        bwd = bwd + delta[f"{prefix}backward"].scaled(count)
        if layout.recompute_granularity == "selective":
            rec = rec + delta[f"{prefix}selective_recompute"].scaled(count)
        elif layout.recompute_granularity == "full":  # block recompute: pro rata, as for the MoE share
            share = min(layers, layout.recompute_num_layers) / layers if layout.recompute_method == "block" else 1
            rec = rec + delta[f"{prefix}forward"].scaled(count * share)
    return fwd, bwd, rec
