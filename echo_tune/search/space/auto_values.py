"""``auto`` in a search space: every value of one setting that the single-setting rules allow.

Combinations are checked later, by ``check_compatible`` (``layouts.py``).
"""

from __future__ import annotations

import math

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.specs.model import ModelSpec
from echo_tune.errors import ConfigError
from echo_tune.search.space.feature_values import FEATURE_AUTO
from echo_tune.search.space.fields import BOOL_FIELDS
from echo_tune.search.space.pipeline_layouts import balanced_layouts
from echo_tune.search.space.uneven import EVEN as OFF_SPLIT, SPLIT_FIELDS, canonical_splits, split_vpp_values

# Caps on `auto` (list the values to go past them): a micro-batch past 8 sequences only grows activation
# memory once the GEMMs are large; context parallelism past 8, or under 1024 tokens per CP rank, splits the
# sequence finer than the attention kernels stay efficient at -- such values wasted a third of TPE's trials.
MAX_MICRO_BATCH = 8
MAX_CONTEXT_PARALLEL = 8
MIN_TOKENS_PER_CP_RANK = 1024
AUTO_CAPS = (f"auto: micro-batch sizes up to {MAX_MICRO_BATCH}; CP up to {MAX_CONTEXT_PARALLEL} with at least "
             f"{MIN_TOKENS_PER_CP_RANK} tokens per CP rank")


def _divisors(n: int) -> list[int]:
    # pairs up to sqrt(n): a global batch of 2**40 takes 2**20 steps, not 2**40 (issue 10, bounded work)
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def context_parallel_values(num_gpus: int, seq_length: int) -> tuple[int, ...]:
    """CP sizes dividing ``num_gpus``: Megatron splits the sequence into 2*CP chunks; capped (AUTO_CAPS)."""
    return tuple(d for d in _divisors(num_gpus) if d == 1 or (
        seq_length % (2 * d) == 0 and d <= MAX_CONTEXT_PARALLEL and seq_length // d >= MIN_TOKENS_PER_CP_RANK))


def micro_batch_values(global_batch_size: int) -> tuple[int, ...]:
    """Micro-batch sizes dividing the global batch; capped (AUTO_CAPS)."""
    return tuple(d for d in _divisors(global_batch_size) if d <= MAX_MICRO_BATCH)


def auto_values(field_name: str, model: ModelSpec, cluster: ClusterSpec, num_gpus: tuple[int, ...],
                choices: dict[str, tuple], gbs: int, *, uneven: bool = False) -> tuple:
    """Every value of ``field_name`` that the single-setting rules allow (combinations are checked later).

    ``uneven``: the space lets PP leave a remainder of layers, split by the canonical uneven splits
    (search/space/uneven.py); then PP takes every size with such a split, and the split settings their values."""
    node = cluster.gpus_per_node
    if field_name == "tensor_model_parallel_size":  # inside one node, dividing heads, query groups and FFN
        return tuple(d for d in _divisors(node) if any(n % d == 0 for n in num_gpus)
                     and model.num_attention_heads % d == 0 and model.query_groups % d == 0
                     and model.ffn_size % d == 0)
    if field_name == "pipeline_model_parallel_size":  # even stages (or a canonical uneven split), dividing the GPUs
        if uneven:
            return tuple(d for d in sorted({d for n in num_gpus for d in _divisors(n)})
                         if canonical_splits(model.num_layers, d))
        return tuple(d for d in _divisors(model.num_layers) if any(n % d == 0 for n in num_gpus))
    pps = choices.get("pipeline_model_parallel_size", (1,))
    if field_name in SPLIT_FIELDS:  # the values the canonical splits of the PP sizes take
        i = SPLIT_FIELDS.index(field_name)
        values = {s[i] for p in pps for s in canonical_splits(model.num_layers, p)} | {OFF_SPLIT[i]}
        return tuple(sorted(values, key=lambda v: (v is not None and v is not False, v or 0)))
    if field_name == "context_parallel_size":  # Megatron splits the sequence into 2*CP chunks; capped (AUTO_CAPS)
        if not model.flash_attention:  # CP needs flash-style attention (compatibility.py, local_spec.py)
            return (1,)
        return context_parallel_values(max(num_gpus), model.seq_length)
    if field_name == "expert_model_parallel_size":  # divisors of the expert count (1 for a dense model)
        if not model.is_moe:
            return (1,)
        return tuple(d for d in _divisors(model.num_experts) if any(n % d == 0 for n in num_gpus))
    if field_name == "expert_tensor_parallel_size":  # None (= TP, Megatron's default) or a size inside a node
        if not model.is_moe:
            return (None,)
        return (None,) + tuple(d for d in _divisors(node) if model.moe_ffn_size % d == 0
                               and any(n % d == 0 for n in num_gpus))
    if field_name == "micro_batch_size":  # capped (AUTO_CAPS)
        return micro_batch_values(gbs)
    stage_layers = sorted({model.num_layers // p for p in pps if p > 1 and model.num_layers % p == 0})
    if field_name == "virtual_pipeline_model_parallel_size":
        values = {v for s in stage_layers for v in _divisors(s) if v > 1}
        if uneven:
            values |= {v for p in pps if p > 1 for v in split_vpp_values(model.num_layers, p)}
        return (None,) + tuple(sorted(values))
    if field_name == "recompute_num_layers":
        return tuple(_divisors(model.num_layers))
    if field_name == "recompute_granularity":
        return (None, "selective", "full")
    if field_name == "recompute_method":
        return ("uniform", "block")
    if field_name in BOOL_FIELDS:
        return (False, True)
    if field_name == "fp8_format":  # bf16 GEMMs, or FP8 where the GPU has FP8 tensor cores
        return (None, "hybrid") if cluster.gpu.peak_fp8_tflops is not None else (None,)
    if field_name in FEATURE_AUTO:
        return FEATURE_AUTO[field_name](model, cluster)
    if field_name == "pipeline_model_parallel_layout":  # balanced layouts for the layer count (pipeline_layouts.py)
        return (None,) + balanced_layouts(model.num_layers, model.mtp_num_layers or 0)
    raise ConfigError(f"`{field_name}: auto` is not supported (no rule derives its values); list the values")
