"""``--pipeline-model-parallel-layout``: Megatron-LM's language for what each pipeline chunk holds.

Read as Megatron-LM reads it (NVIDIA/Megatron-LM d98e8a64ddf3,
megatron/core/transformer/pipeline_parallel_layer_layout.py ``PipelineParallelLayerLayout``):

- ``parse_str_to_list``: commas are cosmetic and dropped; ``(...)*N`` is unrolled first, then ``x*N``
  (one ``re.sub`` pass each, so parentheses do not nest); ``|`` separates virtual stages; each character
  is a layer: ``E`` embedding, ``t`` transformer (decoder) layer, ``m`` MTP layer, ``L`` loss.
  Megatron-Bridge recipes write ``/`` for ``|`` (scripts/performance, e.g. DeepSeek-V3 ``Et/(tt/)*30mL``);
  echo-tune reads ``/`` as ``|`` and writes ``|`` back.
- the virtual stages are listed chunk-major: entry ``c * PP + s`` is chunk ``c`` of pipeline stage ``s``
  (``__init__``), so the number of entries must be a multiple of PP and gives VPP = entries / PP
  (training/arguments.py sets ``virtual_pipeline_model_parallel_size`` from it);
- ``validate_layer_layout``: the first layer (in layer order) is ``E``, the last ``L``, each once; as many
  ``t`` as ``num_layers`` and ``m`` as ``mtp_num_layers``; MTP after every decoder layer, only in a stage's
  last chunk, all of them in one chunk.

Each rule's failure is one ConfigError line stating the rule, the values and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from echo_tune.errors import ConfigError

LAYER_CHARS = {"E": "embedding", "L": "loss", "t": "decoder", "m": "mtp"}
# pipeline_parallel_layer_layout.py parse_str_to_list: (...)*n first, then x*n
_UNROLL = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))
_MAX_UNROLLED_CHARS = 1_000_000  # bounded work: a layout of a million layers is a typo
_MAX_COUNT_DIGITS = 7  # a repeat count of 9,999,999 at most; more unrolls past the layer limit anyway


@dataclass(frozen=True, kw_only=True)
class ChunkContents:
    """What one model chunk (pipeline stage ``stage``, virtual chunk ``chunk``) builds."""

    layers: int
    """Decoder (transformer) layers."""
    first_layer: int = 0
    """Global index of its first decoder layer (Megatron's layer offset, chunk-major order)."""
    embedding: bool = False
    """Holds the word embedding (pre-process)."""
    loss: bool = False
    """Holds the output layer and the loss (post-process)."""
    mtp_layers: int = 0
    """Multi-token-prediction layers (each with its own output head)."""


def normalize_layout(text: str) -> str:
    """The layout as Megatron reads it: ``/`` (Megatron-Bridge's spelling) becomes ``|``, spaces go."""
    return "".join(str(text).split()).replace("/", "|")


def parse_layout(text: str) -> list[list[str]]:
    """The virtual stages of a layout string in its order, each a list of layer characters.

    Hard limits, checked before anything is unrolled (issue 41): a repeat count has at most
    ``_MAX_COUNT_DIGITS`` digits, parentheses do not nest (Megatron-LM's single ``re.sub`` pass cannot read
    nested ones), and each unrolling pass is sized first, so no layout builds more than
    ``_MAX_UNROLLED_CHARS`` characters."""
    unrolled = normalize_layout(text).replace(",", "")
    _check_counts_and_nesting(unrolled, text)
    for pattern in _UNROLL:
        size = len(unrolled) + sum(len(m.group(1)) * int(m.group(2)) - len(m.group(0))
                                   for m in pattern.finditer(unrolled))
        if size > _MAX_UNROLLED_CHARS:
            raise ConfigError(f"pipeline_model_parallel_layout: `unrolled layers <= {_MAX_UNROLLED_CHARS:,}` must "
                              f"hold (a layout of a million layers is a typo), but got ({size:,} layers unrolled from "
                              f"{_shown(text)}); check the repeat counts")
        unrolled = pattern.sub(lambda x: x.group(1) * int(x.group(2)), unrolled)
    stages = []
    for stage in unrolled.split("|"):
        bad = [ch for ch in stage if ch not in LAYER_CHARS]
        if bad:
            raise ConfigError(f"pipeline_model_parallel_layout may only use the layer characters "
                              f"{list(LAYER_CHARS)} (and | ( ) * digits), but got ({bad[0]!r} in stage "
                              f"{_shown(stage)} of {_shown(text)}); write E, t, m, L")
        stages.append(list(stage))
    return stages


def _shown(text: str) -> str:
    """``text`` quoted, cut to 80 characters for an error line."""
    text = str(text)
    return repr(text) if len(text) <= 80 else repr(text[:77]) + "..."


def _check_counts_and_nesting(text: str, original: str) -> None:
    """Repeat counts of at most ``_MAX_COUNT_DIGITS`` digits (Python refuses to read an integer of more than
    4,300 digits, and any count past 1,000,000 unrolls past the layer limit), and no nested parentheses."""
    for m in re.finditer(r"\d+", text):
        if len(m.group()) > _MAX_COUNT_DIGITS:
            raise ConfigError(f"pipeline_model_parallel_layout: `repeat count digits <= {_MAX_COUNT_DIGITS}` must "
                              f"hold (a count past {10**_MAX_COUNT_DIGITS - 1:,} unrolls past "
                              f"{_MAX_UNROLLED_CHARS:,} layers), but got a count of {len(m.group()):,} digits in "
                              f"{_shown(original)}; check the repeat counts")
    depth = 0
    for ch in text:
        depth += (ch == "(") - (ch == ")")
        if depth > 1:
            raise ConfigError(f"pipeline_model_parallel_layout: `parenthesis depth <= 1` must hold (Megatron-LM "
                              f"unrolls (...)*N in one pass, so parentheses do not nest), but got nested "
                              f"parentheses in {_shown(original)}; write the inner repeat out, e.g. (tt|)*4")


def num_virtual_stages(text: str) -> int:
    """PP x VPP entries of a layout (``get_num_stages_from_str``)."""
    return len(parse_layout(text))


def layout_contents(text: str, pipeline_model_parallel_size: int, num_layers: int,
                    mtp_num_layers: int | None) -> tuple[tuple[ChunkContents, ...], ...]:
    """Per pipeline stage, per chunk: what the layout puts there; ConfigError for any of Megatron's rules."""
    entries = parse_layout(text)
    pp = pipeline_model_parallel_size
    if len(entries) % pp:
        raise ConfigError(f"`len(pipeline_model_parallel_layout) % pipeline_model_parallel_size == 0` must hold "
                          f"(stages are listed chunk by chunk), but got ({len(entries)} stages in {text!r}, "
                          f"pipeline_model_parallel_size={pp}); list PP x VPP stages separated by |")
    vpp = len(entries) // pp
    grid = [[entries[c * pp + s] for c in range(vpp)] for s in range(pp)]
    flat = [ch for c in range(vpp) for s in range(pp) for ch in grid[s][c]]  # layer order
    _validate(flat, grid, text, num_layers, mtp_num_layers or 0)
    out, offset = [[None] * vpp for _ in range(pp)], 0
    for c in range(vpp):
        for s in range(pp):
            chars = grid[s][c]
            out[s][c] = ChunkContents(layers=chars.count("t"), first_layer=offset, embedding="E" in chars,
                                      loss="L" in chars, mtp_layers=chars.count("m"))
            offset += chars.count("t")
    return tuple(tuple(row) for row in out)


def _validate(flat: list[str], grid: list[list[list[str]]], text: str, num_layers: int, mtp: int) -> None:
    """``validate_layer_layout`` of pipeline_parallel_layer_layout.py, rule by rule."""
    def need(ok: bool, rule: str, got: str, fix: str) -> None:
        if not ok:
            raise ConfigError(f"pipeline_model_parallel_layout: {rule} must hold, but got ({got}, "
                              f"layout={text!r}); {fix}")

    need(bool(flat) and flat[0] == "E", "`the first layer is the embedding E`", f"first={flat[0] if flat else None!r}",
         "start the first stage with E")
    need(flat[-1] == "L", "`the last layer is the loss L`", f"last={flat[-1]!r}", "end the last stage with L")
    need(flat.count("E") == 1, "`E appears exactly once`", f"E count={flat.count('E')}", "write E once")
    need(flat.count("L") == 1, "`L appears exactly once`", f"L count={flat.count('L')}", "write L once")
    need(flat.count("t") == num_layers, "`number of t == num_layers`",
         f"t count={flat.count('t')}, num_layers={num_layers}", "write one t per decoder layer")
    need(flat.count("m") == mtp, "`number of m == mtp_num_layers`",
         f"m count={flat.count('m')}, mtp_num_layers={mtp}", "write one m per MTP layer")
    if "m" in flat:
        need("t" not in flat[flat.index("m"):], "`decoder layers t come before the MTP layers m`",
             f"first m at layer {flat.index('m')}", "move the m after every t")
    vpp = len(grid[0])
    for s, row in enumerate(grid):
        for c in range(vpp - 1):
            need("m" not in row[c], "`MTP layers sit in a stage's last virtual chunk`", f"m in stage {s} chunk {c}",
                 "move the m to the stage's last chunk")
        if "m" in row[-1]:
            need(row[-1].count("m") == mtp, "`all MTP layers sit in one virtual chunk`",
                 f"{row[-1].count('m')} of {mtp} m in stage {s}", "put every m in the same chunk")
