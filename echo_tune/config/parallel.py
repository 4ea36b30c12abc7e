"""The parallel layout and training settings: one field per Megatron-LM argument.

Only user choices are fields. Derived values (data-parallel size, micro-batch count, layers per
stage) are computed by ``Layout`` in ``compatibility.py`` once the world size is known.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from echo_tune.config._checks import require, require_choice, require_positive
from echo_tune.config.cluster import PRECISIONS

RECOMPUTE_GRANULARITIES = (None, "full", "selective")
RECOMPUTE_METHODS = (None, "uniform", "block")


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    """A Megatron-LM parallel layout and the training settings that shape one step."""

    tensor_model_parallel_size: int = 1
    """``--tensor-model-parallel-size``: TP degree (innermost ranks, inside a node)."""

    pipeline_model_parallel_size: int = 1
    """``--pipeline-model-parallel-size``: number of pipeline stages."""

    context_parallel_size: int = 1
    """``--context-parallel-size``: CP degree (sequence split for attention)."""

    virtual_pipeline_model_parallel_size: int | None = None
    """``--virtual-pipeline-model-parallel-size``: model chunks per stage (interleaved 1F1B); None or 1 = off."""

    num_layers_per_virtual_pipeline_stage: int | None = None
    """``--num-layers-per-virtual-pipeline-stage``: the other way to ask for interleaving."""

    decoder_first_pipeline_num_layers: int | None = None
    """``--decoder-first-pipeline-num-layers``: layers on the first stage when stages are uneven."""

    decoder_last_pipeline_num_layers: int | None = None
    """``--decoder-last-pipeline-num-layers``: layers on the last stage when stages are uneven."""

    micro_batch_size: int = 1
    """``--micro-batch-size``: samples per micro-batch per data-parallel rank."""

    global_batch_size: int
    """``--global-batch-size``: samples per optimizer step, over all data-parallel ranks."""

    recompute_granularity: str | None = None
    """``--recompute-granularity``: None, full or selective."""

    recompute_method: str | None = None
    """``--recompute-method``: uniform or block (with full recompute)."""

    recompute_num_layers: int | None = None
    """``--recompute-num-layers``: layers per recompute unit (uniform) or recomputed layers per stage (block)."""

    sequence_parallel: bool = False
    """``--sequence-parallel``: shard norms/dropout over TP; all-gather + reduce-scatter instead of all-reduce."""

    use_distributed_optimizer: bool = False
    """``--use-distributed-optimizer``: shard optimizer states over DP (ZeRO-1)."""

    overlap_grad_reduce: bool = False
    """``--overlap-grad-reduce``: reduce gradient buckets during the backward pass."""

    overlap_param_gather: bool = False
    """``--overlap-param-gather``: all-gather parameters during the next forward pass (distributed optimizer)."""

    tp_comm_overlap: bool = False
    """``--tp-comm-overlap``: overlap TP/SP collectives with the GEMMs that use them."""

    precision: str = "bf16"
    """``--bf16`` / ``--fp16`` (or fp32 when neither is given)."""

    def __post_init__(self) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                     "micro_batch_size", "global_batch_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool),
                    f"`{name}` must be an integer, but got ({name}={value!r})")
            require_positive(name, value)
        for name in ("virtual_pipeline_model_parallel_size", "num_layers_per_virtual_pipeline_stage",
                     "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers",
                     "recompute_num_layers"):
            if getattr(self, name) is not None:
                require_positive(name, getattr(self, name))
        require_choice("recompute_granularity", self.recompute_granularity, RECOMPUTE_GRANULARITIES)
        require_choice("recompute_method", self.recompute_method, RECOMPUTE_METHODS)
        require_choice("precision", self.precision, PRECISIONS)

    def replace(self, **changes) -> "ParallelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        # asdict's deep copy, without its cost (~0.2 ms, paid several times per simulated layout) for the
        # plain values every field holds today
        return {f.name: _copy_value(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _copy_value(value):
    return value if isinstance(value, (str, int, float, bool, type(None))) else copy.deepcopy(value)
