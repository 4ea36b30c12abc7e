"""``pipeline_model_parallel_layout: auto``: balanced pipeline layouts generated for the model's layer count.

A layout (config/specs/pipeline_layout.py, Megatron's ``--pipeline-model-parallel-layout``) says what each pipeline chunk
holds: decoder layers ``t``, the embedding ``E``, MTP layers ``m`` and the loss ``L``. Recipes use it where the
layers do not divide into the chunks: DeepSeek-V3's 61 layers, its MTP layer, the embedding and the loss over
PP 8 x VP 4 = 32 chunks of two slots each, ``Et|(tt|)*30mL`` (Megatron-Bridge@v0.1.0rc4 scripts/performance
run_script.py). The generated layouts count the embedding and the loss as a layer each or not (the four ways, as
``--account-for-embedding/loss-in-pipeline-split`` do) and an MTP layer as a layer, and give every chunk the same
number of slots: the embedding in the first chunk, MTP and the loss in the last, the decoder layers in order.
A chunk count C serves every PP dividing it (VPP = C / PP); each layout is written in Megatron's repeat form.
"""

from __future__ import annotations

from echo_tune.config.specs.pipeline_layout import num_virtual_stages

MAX_SLOTS_PER_CHUNK_LAYOUTS = 64
"""Chunk counts are taken from 2 up to the slots (each chunk at least one slot); at most this many layouts per
counting of the embedding and the loss (the smallest chunk counts, i.e. the fewest pipeline chunks, first)."""


def _t(n: int) -> str:
    """``n`` decoder layers, in Megatron's ``t*N`` form from 4 on."""
    return f"t*{n}" if n >= 4 else "t" * n


def _layout(first: str, middle: str, last: str, chunks: int) -> str:
    """First chunk, ``chunks - 2`` middle ones (a ``(...)*N`` repeat from two on), last chunk."""
    if chunks == 2:
        return f"{first}|{last}"
    return f"{first}|" + (f"({middle}|)*{chunks - 2}" if chunks > 3 else f"{middle}|") + last


def balanced_layouts(num_layers: int, mtp_layers: int = 0, *, every_counting: bool = False) -> tuple[str, ...]:
    """The balanced layouts of ``num_layers`` decoder layers and ``mtp_layers`` MTP layers (see the module doc),
    the embedding and the loss counted as a layer each (the recipes' way: DeepSeek-V3's ``Et|(tt|)*30mL``), or
    with ``every_counting`` also the three other ways."""
    out: list[str] = []
    countings = ((True, True), (True, False), (False, True), (False, False)) if every_counting else ((True, True),)
    for count_embedding, count_loss in countings:
        if True:
            slots = num_layers + mtp_layers + int(count_embedding) + int(count_loss)
            found = 0
            for chunks in range(2, slots + 1):
                if slots % chunks or found >= MAX_SLOTS_PER_CHUNK_LAYOUTS:
                    continue
                per = slots // chunks
                first_t = per - int(count_embedding)
                last_t = per - mtp_layers - int(count_loss)
                if first_t < 0 or last_t < 0 or first_t + last_t + per * (chunks - 2) != num_layers:
                    continue
                text = _layout("E" + _t(first_t), _t(per), _t(last_t) + "m" * mtp_layers + "L", chunks)
                if text not in out:
                    out.append(text)
                    found += 1
    return tuple(out)


def layouts_for_pp(values: tuple, pp: int) -> tuple:
    """The listed layouts a pipeline of ``pp`` stages can take (their chunk count a multiple of it), after None."""
    return (None,) + tuple(v for v in values if v is not None and num_virtual_stages(v) % pp == 0)
