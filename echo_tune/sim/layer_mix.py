"""Which layers of each model chunk are MoE layers (``--moe-layer-freq``: dense and MoE layers mixed).

Global layer indices per chunk follow Megatron-Core's layer offsets (megatron/core/transformer/
transformer_layer.py ``get_transformer_layer_offset``, NVIDIA/Megatron-LM commit d98e8a64ddf3): layers are
numbered chunk-major, chunk c of every stage before chunk c + 1, each chunk after the layers of the chunks
before it (uneven stages and ``--pipeline-model-parallel-layout`` included); ``Layout.chunk_contents``
holds each chunk's first layer.
"""

from __future__ import annotations

from echo_tune.config.compatibility import Layout
from echo_tune.config.model import ModelSpec


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


def moe_notes(model: ModelSpec, layout: Layout) -> tuple[str, ...]:
    """The MoE assumptions a report states (routing, dispatcher, expert groups)."""
    if not model.is_moe:
        return ()
    groups = layout.groups
    share = model.moe_routing_imbalance
    notes = [f"MoE routing assumed {'balanced' if share == 1 else f'imbalanced: busiest expert x{share:g}'}"
             f"{f', capacity factor {model.moe_expert_capacity_factor:g}' if model.moe_expert_capacity_factor else ''}"
             f" (set moe_routing_imbalance for skewed routing; the busiest rank sets the step)",
             f"expert groups: EP {groups['ep'].size} over {groups['ep'].num_nodes} node(s), ETP {groups['etp'].size}, "
             f"expert data-parallel {groups['edp'].size}; dispatch/combine time is ep_comm"]
    if model.moe_token_dispatcher_type == "flex":
        notes.append("flex dispatcher timed as alltoall (without DeepEP's de-duplication: an upper bound)")
    return tuple(notes)
