"""Which layers of each model chunk are MoE layers (``--moe-layer-freq``: dense and MoE layers mixed).

Global layer indices per chunk follow Megatron-Core's layer offsets (megatron/core/transformer/
transformer_layer.py ``get_transformer_layer_offset``, NVIDIA/Megatron-LM commit d98e8a64ddf3): layers are
numbered chunk-major, chunk c of every stage before chunk c + 1, each chunk after the layers of the chunks
before it (uneven stages and ``--pipeline-model-parallel-layout`` included); ``Layout.chunk_contents``
holds each chunk's first layer.
"""

from __future__ import annotations

from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.cost.collectives.flex_bandwidth import label as flex_bandwidth_label
from echo_tune.sim.features.determinism import NOTE


def chunk_first_layer(layout: Layout, stage: int, chunk: int) -> int:
    return layout.chunk_contents[stage][chunk].first_layer


def chunk_moe_layers(model: ModelSpec, layout: Layout, stage: int, chunk: int) -> int:
    """MoE layers among the layers of one chunk (0 for a dense model)."""
    if not model.is_moe:
        return 0
    first = chunk_first_layer(layout, stage, chunk)
    return sum(model.moe_pattern[first:first + layout.stage_chunk_layers[stage][chunk]])


def chunk_layer_mix(model: ModelSpec, layout: Layout) -> tuple[tuple[tuple[int, int], ...], ...]:
    """(dense layers, MoE layers) of every chunk of every stage, MTP layers included.

    Multi-token prediction (``--mtp-num-layers``): Megatron-Core builds the MTP block in the chunk the
    layout puts it in (the last chunk of the last stage without a layout; gpt_model.py); each MTP layer is
    a transformer layer of the last layer's kind (as in Megatron's FLOP count), so it is counted in that
    chunk. Its extra output head is added by ``simulate``; its eh projection GEMM (2h -> h) and embedding
    lookup are not traced (a few percent of one layer's time), their parameters are counted.
    """
    mtp_moe = bool(model.moe_pattern[-1]) if model.num_layers else False
    mix = []
    for s, row in enumerate(layout.chunk_contents):
        out = []
        for c, contents in enumerate(row):
            k = chunk_moe_layers(model, layout, s, c)
            dense, moe = contents.layers - k, k
            if contents.mtp_layers:
                dense, moe = (dense, moe + contents.mtp_layers) if mtp_moe else (dense + contents.mtp_layers, moe)
            out.append((dense, moe))
        mix.append(tuple(out))
    return tuple(mix)


def chunk_window_mix(model: ModelSpec, layout: Layout) -> tuple[tuple[tuple[int, int], ...], ...]:
    """(dense, MoE) layers with sliding-window attention in every chunk of every stage (all 0 without a
    window): ``model.window_pattern`` (``--window-attn-skip-freq``) over the chunk's global layers. MTP
    layers are counted with full attention."""
    return chunk_pattern_mix(model.window_pattern if model.windowed_attention else None, model.moe_pattern, layout)


def chunk_pattern_mix(pattern: tuple[int, ...] | None, moe: tuple[int, ...],
                      layout: Layout) -> tuple[tuple[tuple[int, int], ...], ...]:
    """(dense, MoE) layers of every chunk of every stage that a per-layer 0/1 ``pattern`` marks (a layer variant:
    sliding window, gated delta net), split by the model's ``moe`` pattern; all 0 for None (no such layer)."""
    if pattern is None:
        return tuple(tuple((0, 0) for _ in chunks) for chunks in layout.stage_chunk_layers)
    mix = []
    for s, chunks in enumerate(layout.stage_chunk_layers):
        row = []
        for c, layers in enumerate(chunks):
            first = chunk_first_layer(layout, s, c)
            span = range(first, first + layers)
            row.append((sum(pattern[i] * (1 - moe[i]) for i in span), sum(pattern[i] * moe[i] for i in span)))
        mix.append(tuple(row))
    return tuple(mix)


LEARNED_ROUTER_LOAD = ("one public measurement of a learned router in training: the busiest EP rank 1.7-2.0x a "
                       "balanced share, the average rank 1.2-1.3x, the step 2.1x the force-balanced one "
                       "(marin-community/marin issue 7668: 64 GB200, EP 64, auxiliary-loss-free routing)")
"""What the routing note says of skew where the layout does not force balance: a measured reference for
``moe_routing_imbalance`` (EP-rank overload worst / average 1.971 / 1.338 at the start of training, 1.724 / 1.212 after
18 steps; 18.39 s against 8.69 s per step force-balanced, the issue's p50s), not a default: one run, one router."""


def moe_notes(model: ModelSpec, layout: Layout, gpu_name: str = "") -> tuple[str, ...]:
    """The MoE assumptions a report states (routing, dispatcher and where its bandwidths come from for ``gpu_name``,
    expert groups)."""
    if not model.is_moe:
        return ()
    groups = layout.groups
    share = model.moe_effective_imbalance
    balanced = "balanced (forced: --moe-router-force-load-balancing)" if model.moe_router_force_load_balancing \
        else "balanced"
    notes = [f"MoE routing assumed {balanced if share == 1 else f'imbalanced: busiest expert x{share:g}'}"
             f"{f', capacity factor {model.moe_expert_capacity_factor:g}' if model.moe_expert_capacity_factor else ''}"
             f" (set moe_routing_imbalance for skewed routing; the busiest rank sets the step"
             f"{'' if model.moe_router_force_load_balancing or share != 1 else '; ' + LEARNED_ROUTER_LOAD})",
             f"expert groups: EP {groups['ep'].size} over {groups['ep'].num_nodes} node(s), ETP {groups['etp'].size}, "
             f"expert data-parallel {groups['edp'].size}; dispatch/combine time is ep_comm"]
    kernel = model.moe_dispatcher_kernel
    if kernel in ("deepep", "hybridep"):
        notes.append(f"flex dispatcher: {kernel} kernels with de-duplicated copies (cost/collectives/moe_dispatch.py); "
                     f"{flex_bandwidth_label(gpu_name)}")
    if model.moe_router_group_topk:
        notes.append(f"group-limited routing: a token's experts come from {model.moe_router_group_topk} of "
                     f"{model.moe_router_num_groups} groups")
    return tuple(notes)


def layer_notes(model: ModelSpec, parallel) -> tuple[str, ...]:
    """The layer-variant assumptions a report states (sliding window, deterministic mode)."""
    notes = []
    if model.windowed_attention:
        notes.append(f"sliding window {model.window_left} on {sum(model.window_pattern)} of {model.num_layers} "
                     f"layers: attention time counts the keys inside the window; model FLOPs / MFU follow Megatron's "
                     f"num_floating_point_operations, which counts full causal attention on every layer")
    if parallel.deterministic_mode:
        notes.append(NOTE)
    return tuple(notes)
