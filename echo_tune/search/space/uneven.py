"""Uneven pipeline splits a search tries when PP does not divide the layers (``auto`` in a space).

Megatron-LM d98e8a64ddf3 offers two ways to split L layers over PP stages unevenly
(core/transformer/transformer_block.py ``get_num_layers_to_build``, transformer_config.py):

- ``--decoder-first/last-pipeline-num-layers``: those stages fixed, the other stages even;
- ``--account-for-embedding/loss-in-pipeline-split``: the embedding (loss) counts as a layer, so
  ``(L + 1 or 2) / PP`` per stage and the first (last) stage builds one layer fewer.

Per PP the search tries a small canonical set rather than every count (``canonical_splits``):

- PP dividing L: the even split only;
- otherwise each of ``account_for`` both and loss only whose ``(L + extra) % PP == 0``, and with the
  middle stages at ``ceil(L / PP)`` layers: the rest on the first and last stages (the last one, which
  also runs the output layer and loss, taking the smaller half), or on the last stage only; a decoder
  split that gives the same layers per stage as an ``account_for`` split is dropped (the latter also
  interleaves: its chunks hold (L + extra) / PP / VPP).

Splits that lighten the first stage only (embedding only, first stage only) are left out: the last
stage, which runs the output layer and loss, is the heavier end. So at most four splits per PP:
e.g. DeepSeek-V3 (61 layers) at PP 8 gets first 7 / last 6 (middle 8) and last 5; Llama-3.1 405B (126)
at PP 8 gets account-for-both (16 per stage, 15 on the ends) and last 14 (the first/last 15/15 split
equals account-for-both).
"""

from __future__ import annotations

import functools
import math

from echo_tune.config.rules.stage_split import split_layers

SPLIT_FIELDS = ("decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split")
EVEN = (None, None, False, False)


@functools.lru_cache(maxsize=1024)
def canonical_splits(num_layers: int, pp: int) -> tuple[tuple, ...]:
    """(first, last, account_for_embedding, account_for_loss) of each split tried at this PP."""
    if pp == 1 or num_layers % pp == 0:
        return (EVEN,) if pp <= num_layers else ()
    out, seen = [], set()
    for emb, loss in ((True, True), (False, True)):
        extra = emb + loss
        per_stage = (num_layers + extra) // pp
        if (num_layers + extra) % pp == 0 and per_stage - 1 >= 1:  # each stage keeps a layer
            out.append((None, None, emb, loss))
            seen.add((per_stage - emb,) + (per_stage,) * (pp - 2) + (per_stage - loss,))
    middle = math.ceil(num_layers / pp)
    rest_two = num_layers - (pp - 2) * middle  # first + last
    rest_one = num_layers - (pp - 1) * middle  # one end stage
    candidates = []
    if rest_two >= 2:
        candidates.append((rest_two - rest_two // 2, rest_two // 2))
    if rest_one >= 1:
        candidates.append((None, rest_one))
    for first, last in candidates:
        stages = (middle,) * pp
        stages = ((first if first is not None else middle),) + stages[1:-1] + (
            (last if last is not None else middle),)
        if stages not in seen:
            seen.add(stages)
            out.append((first, last, False, False))
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def split_stage_layers(num_layers: int, pp: int, split: tuple) -> tuple[int, ...]:
    """The layers per stage Megatron divides by VPP for a split (account_for: (L + extra) / PP each)."""
    return split_layers(num_layers, pp, *split)


def split_vpp_values(num_layers: int, pp: int) -> set[int]:
    """VPP > 1 values that divide every stage of some canonical split at this PP."""
    out = set()
    for split in canonical_splits(num_layers, pp):
        g = functools.reduce(math.gcd, split_stage_layers(num_layers, pp, split))
        out |= {v for v in range(2, g + 1) if g % v == 0}
    return out


def consistent_values(field_name: str, values: tuple, num_layers: int, chosen: dict) -> tuple:
    """Of ``values``, those some canonical split at the chosen PP takes, given the split fields chosen."""
    pp = chosen.get("pipeline_model_parallel_size", 1)
    i = SPLIT_FIELDS.index(field_name)
    splits = [s for s in canonical_splits(num_layers, pp)
              if all(s[j] == chosen[f] for j, f in enumerate(SPLIT_FIELDS) if f in chosen)]
    return tuple(v for v in values if any(s[i] == v for s in splits))
