"""What each pipeline stage and model chunk holds: decoder layers, embedding, loss, MTP layers.

Four ways to say it, as Megatron-LM d98e8a64ddf3 reads them:

- ``--pipeline-model-parallel-layout`` (config/specs/pipeline_layout.py): every chunk spelled out; it also sets
  VPP (training/arguments.py) and cannot be combined with the other three (TransformerConfig
  ``__post_init__``: "pipeline_model_parallel_layout cannot be set with other pipeline layout arguments");
- even stages: ``num_layers / PP`` layers per stage;
- ``--decoder-first/last-pipeline-num-layers``: those stages fixed, the rest even
  (core/transformer/transformer_block.py ``get_num_layers_to_build``);
- ``--account-for-embedding/loss-in-pipeline-split``: the embedding (loss) counts as a layer of the split,
  so the first (last) model chunk builds one decoder layer fewer.

With ``VPP`` chunks per stage each stage's layers split evenly over its chunks, and layers are numbered
chunk-major: chunk c of every stage before chunk c + 1 (core/transformer/transformer_layer.py
``get_transformer_layer_offset``). Without a layout, the embedding sits in the first chunk of the first
stage, the output layer, loss and MTP layers in the last chunk of the last stage (gpt_model.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from echo_tune.config._checks import require
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.config.specs.pipeline_layout import ChunkContents, layout_contents

Contents = tuple[tuple[ChunkContents, ...], ...]


_SPLIT_FIELDS = ("pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
                 "num_layers_per_virtual_pipeline_stage", "decoder_first_pipeline_num_layers",
                 "decoder_last_pipeline_num_layers", "account_for_embedding_in_pipeline_split",
                 "account_for_loss_in_pipeline_split", "pipeline_model_parallel_layout")


def split_stages(model: ModelSpec, parallel: ParallelConfig) -> Contents:
    """Per stage, per chunk: its contents (VPP = chunks per stage); ConfigError for a broken rule."""
    return _split_cached(model.num_layers, model.mtp_num_layers, *(getattr(parallel, f) for f in _SPLIT_FIELDS))


@functools.lru_cache(maxsize=4096)  # a search checks the same few splits tens of thousands of times
def _split_cached(num_layers: int, mtp_num_layers: int | None, *values) -> Contents:
    model = _Layers(num_layers=num_layers, mtp_num_layers=mtp_num_layers)
    return _split(model, _Split(**dict(zip(_SPLIT_FIELDS, values))))


@dataclass(frozen=True)
class _Layers:
    num_layers: int
    mtp_num_layers: int | None


@dataclass(frozen=True, kw_only=True)
class _Split:
    """The split settings of a ParallelConfig (only those are read here)."""
    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int | None
    num_layers_per_virtual_pipeline_stage: int | None
    decoder_first_pipeline_num_layers: int | None
    decoder_last_pipeline_num_layers: int | None
    account_for_embedding_in_pipeline_split: bool
    account_for_loss_in_pipeline_split: bool
    pipeline_model_parallel_layout: str | None


def _split(model, parallel) -> Contents:
    if parallel.pipeline_model_parallel_layout is not None:
        return _from_layout(model, parallel)
    stage_layers = _split_layers(model, parallel)
    vpp = _virtual_size(parallel, stage_layers)
    p = len(stage_layers)
    if vpp > 1:
        require(p > 1, f"the interleaved schedule needs `pipeline_model_parallel_size > 1`, but got "
                       f"(pipeline_model_parallel_size={p}, virtual_pipeline_model_parallel_size={vpp})")
        # transformer_config.py (uneven first / last stages) and transformer_block.py (every stage)
        bad = [(s, n) for s, n in enumerate(stage_layers) if n % vpp]
        require(not bad, f"`layers per stage % virtual_pipeline_model_parallel_size == 0` must hold, but got "
                         f"(layers per stage={bad[0][1] if bad else 0} on stage {bad[0][0] if bad else 0}, "
                         f"virtual_pipeline_model_parallel_size={vpp}); pick a VPP dividing every stage's layers")
    chunks = [[layers // vpp] * vpp for layers in stage_layers]
    chunks[0][0] -= int(parallel.account_for_embedding_in_pipeline_split)
    chunks[-1][-1] -= int(parallel.account_for_loss_in_pipeline_split)
    require(chunks[0][0] >= 0 and chunks[-1][-1] >= 0,
            f"the first/last model chunk needs a layer to give up for the embedding/loss, but got "
            f"(layers per model chunk={stage_layers[0] // vpp})")
    require(min(sum(c) for c in chunks) > 0, f"every pipeline stage needs at least one layer, but got "
                                            f"(stage layers={[sum(c) for c in chunks]})")
    mtp = model.mtp_num_layers or 0
    out, offset = [[None] * vpp for _ in range(p)], 0
    for c in range(vpp):
        for s in range(p):
            last = (s, c) == (p - 1, vpp - 1)
            out[s][c] = ChunkContents(layers=chunks[s][c], first_layer=offset, embedding=(s, c) == (0, 0),
                                      loss=last, mtp_layers=mtp if last else 0)
            offset += chunks[s][c]
    return tuple(tuple(row) for row in out)


def _from_layout(model, parallel) -> Contents:
    others = {name: getattr(parallel, name) for name in (
        "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
        "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
        "num_layers_per_virtual_pipeline_stage") if getattr(parallel, name) not in (None, False)}
    require(not others, f"pipeline_model_parallel_layout cannot be combined with other pipeline split settings "
                        f"(Megatron's TransformerConfig and arguments.py refuse it), but got ({others}); drop them")
    contents = layout_contents(parallel.pipeline_model_parallel_layout, parallel.pipeline_model_parallel_size,
                               model.num_layers, model.mtp_num_layers)
    detected, given = len(contents[0]), parallel.virtual_pipeline_model_parallel_size
    # transformer_config.py: a VPP given beside the layout must be the layout's
    require(given is None or given == detected,
            f"`virtual_pipeline_model_parallel_size == stages in the layout / pipeline_model_parallel_size` must "
            f"hold with pipeline_model_parallel_layout, but got (virtual_pipeline_model_parallel_size={given}, "
            f"layout VPP={detected}); drop the VPP setting (the layout sets it)")
    require(detected == 1 or parallel.pipeline_model_parallel_size > 1,
            f"the interleaved schedule needs `pipeline_model_parallel_size > 1`, but got "
            f"(pipeline_model_parallel_size=1, layout VPP={detected})")
    return contents


def _split_layers(model, parallel) -> tuple[int, ...]:
    """Layers per pipeline stage of a model and layout (see ``split_layers``)."""
    return split_layers(model.num_layers, parallel.pipeline_model_parallel_size,
                        parallel.decoder_first_pipeline_num_layers, parallel.decoder_last_pipeline_num_layers,
                        parallel.account_for_embedding_in_pipeline_split,
                        parallel.account_for_loss_in_pipeline_split)


def split_layers(total: int, pp: int, first: int | None, last: int | None, account_for_embedding: bool,
                 account_for_loss: bool) -> tuple[int, ...]:
    """Layers per pipeline stage (embedding/loss counted as layers under account_for_*), honouring uneven
    first/last stages; a split Megatron refuses raises ConfigError."""
    extra = int(account_for_embedding) + int(account_for_loss)
    require(not extra or (first is None and last is None),
            "account_for_embedding/loss_in_pipeline_split do not combine with uneven first/last stages (Megatron "
            "refuses it, core/transformer/transformer_block.py); drop one of them")
    if extra:
        # Megatron counts the embedding (loss) as one more layer of the split (transformer_block.py
        # get_num_layers_to_build at d98e8a64ddf3); the first (last) model chunk builds one layer fewer.
        require((total + extra) % pp == 0,
                f"`(num_layers + {extra}) % pipeline_model_parallel_size == 0` must hold with "
                f"account_for_embedding/loss_in_pipeline_split, but got (num_layers={total}, "
                f"pipeline_model_parallel_size={pp})")
        return ((total + extra) // pp,) * pp
    if first is None and last is None:
        require(total % pp == 0,
                f"`num_layers % pipeline_model_parallel_size == 0` must hold, but got (num_layers={total}, "
                f"pipeline_model_parallel_size={pp}); pick a divisor of num_layers or set "
                f"decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers")
        return (total // pp,) * pp
    require(pp > 1, f"uneven pipeline stages need `pipeline_model_parallel_size > 1`, but got "
                    f"(pipeline_model_parallel_size={pp}, decoder_first_pipeline_num_layers={first}, "
                    f"decoder_last_pipeline_num_layers={last})")
    fixed = (first or 0) + (last or 0)
    middle = pp - (first is not None) - (last is not None)
    rest = total - fixed
    ok = rest > 0 and middle > 0 and rest % middle == 0 if middle else rest == 0
    require(ok, f"`(num_layers - first - last) % remaining stages == 0` must hold (and be positive), but got "
                f"(num_layers={total}, decoder_first_pipeline_num_layers={first}, "
                f"decoder_last_pipeline_num_layers={last}, remaining stages={middle}); adjust the first/last counts")
    inner = rest // middle if middle else 0
    stages = [inner] * pp
    if first is not None:
        stages[0] = first
    if last is not None:
        stages[-1] = last
    return tuple(stages)


def _virtual_size(parallel, stage_layers: tuple[int, ...]) -> int:
    vpp, per_chunk = parallel.virtual_pipeline_model_parallel_size, parallel.num_layers_per_virtual_pipeline_stage
    require(vpp is None or per_chunk is None,
            f"set only one of virtual_pipeline_model_parallel_size and num_layers_per_virtual_pipeline_stage, "
            f"but got (virtual_pipeline_model_parallel_size={vpp}, num_layers_per_virtual_pipeline_stage={per_chunk})")
    if per_chunk is not None:
        uneven = parallel.decoder_first_pipeline_num_layers or parallel.decoder_last_pipeline_num_layers
        # training/arguments.py: uneven stages take their VPP from --num-virtual-stages-per-pipeline-rank
        require(not uneven, "uneven first/last stages need `virtual_pipeline_model_parallel_size`, not "
                            f"num_layers_per_virtual_pipeline_stage, but got (num_layers_per_virtual_pipeline_stage="
                            f"{per_chunk}); set --num-virtual-stages-per-pipeline-rank instead")
        require(stage_layers[0] % per_chunk == 0,
                f"`layers per stage % num_layers_per_virtual_pipeline_stage == 0` must hold, but got "
                f"(layers per stage={stage_layers[0]}, num_layers_per_virtual_pipeline_stage={per_chunk})")
        vpp = stage_layers[0] // per_chunk
    return vpp or 1


def check_group_size(group: int, pp: int, num_micro_batches: int) -> None:
    """``--microbatch-group-size-per-virtual-pipeline-stage`` rules of the interleaved schedule
    (core/pipeline_parallel/schedules.py ``forward_backward_pipelining_with_interleaving``)."""
    require(pp <= group <= num_micro_batches,
            f"`pipeline_model_parallel_size <= microbatch_group_size_per_vp_stage <= num_micro_batches` must hold, "
            f"but got (pipeline_model_parallel_size={pp}, microbatch_group_size_per_vp_stage={group}, "
            f"num_micro_batches={num_micro_batches}); pick a group size in that range")
    rest = num_micro_batches % group
    require(rest == 0 or rest >= pp,
            f"`num_micro_batches % microbatch_group_size_per_vp_stage` must be 0 or at least "
            f"pipeline_model_parallel_size, but got (num_micro_batches={num_micro_batches}, "
            f"microbatch_group_size_per_vp_stage={group}, pipeline_model_parallel_size={pp}); change the group size")
