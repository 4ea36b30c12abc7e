"""Megatron-FSDP memory: what each rank keeps of the parameters, gradients and optimizer states, and its
unsharded working buffers (Megatron-LM d98e8a64ddf3, core/distributed/fsdp/src/).

Per parameter, with ``--data-parallel-sharding-strategy`` (megatron_fsdp/param_and_grad_buffer.py shards
each buffer over the DP x CP group, ``dp_cp``; routed experts over the expert-data-parallel group):

| strategy           | model weights | main grads | main weights + Adam states |
| no_shard           | p             | g          | m + 8                      |
| optim              | p             | g          | (m + 8) / d                |
| optim_grads        | p             | g / d      | (m + 8) / d                |
| optim_grads_params | p / d         | g / d      | (m + 8) / d                |

p: the model's parameter dtype (2 for bf16); g: ``--megatron-fsdp-main-grads-dtype`` (auto: p);
m: ``--megatron-fsdp-main-params-dtype`` (fp32: 4; auto: 0, the model weights serve as main weights,
mixed_precision.py MixedPrecisionPolicy); Adam's exp_avg and exp_avg_sq: 4 + 4 (or their
``--use-precision-aware-optimizer`` dtypes). With HSDP (``--num-distributed-optimizer-instances N``) d is
DP x CP / N, and ``--outer-dp-sharding-strategy optim`` shards the main weights and states over all DP x CP.

Working buffers: a unit's parameters are all-gathered into an unsharded buffer before its forward and its
backward (optim_grads_params) and its gradients are produced unsharded, then reduce-scattered
(optim_grads, optim_grads_params); with prefetch two units are in flight (``--fsdp-double-buffer`` makes
these two fixed buffers, megatron_fsdp.py / param_and_grad_buffer.py FixedPoolAllocator). Units are the
transformer layers (mcore_fsdp_adapter.py
``fsdp_unit_modules``); the modules outside them (embedding, output layer, final norm) keep their weights
unsharded once gathered (sim/data_parallel/fsdp.py). So: 2 x (largest layer) x (gather bytes + grad-comm bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.specs.parallel import STATE_DTYPE_BYTES, ParallelConfig

DTYPE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}
BUFFERED_UNITS = 2
"""Units whose unsharded buffers are live at once: the one computing and the one prefetched."""


@dataclass(frozen=True, kw_only=True)
class FsdpBytes:
    """Bytes per parameter of each Megatron-FSDP buffer (unsharded sizes)."""
    param: float
    """Model (compute) weights: the training dtype."""
    main_params: float
    """Main weights (``--megatron-fsdp-main-params-dtype``; 0 for auto)."""
    main_grads: float
    """Main gradients (``--megatron-fsdp-main-grads-dtype``; auto: the parameter dtype)."""
    grad_comm: float
    """Gradient reduce-scatter (``--megatron-fsdp-grad-comm-dtype``; auto: the main-grads dtype)."""
    gather: float
    """Parameter all-gather: the parameter dtype, FP8 (1) with ``--fp8-param-gather``."""
    adam_states: float
    """exp_avg + exp_avg_sq."""


def fsdp_bytes(parallel: ParallelConfig) -> FsdpBytes:
    param = 4.0 if parallel.precision == "fp32" else 2.0
    main_params = DTYPE_BYTES.get(parallel.megatron_fsdp_main_params_dtype, 0.0)
    main_grads = DTYPE_BYTES.get(parallel.megatron_fsdp_main_grads_dtype, param)
    grad_comm = DTYPE_BYTES.get(parallel.megatron_fsdp_grad_comm_dtype, main_grads)
    adam = 8.0
    if parallel.use_precision_aware_optimizer:
        adam = STATE_DTYPE_BYTES[parallel.exp_avg_dtype] + STATE_DTYPE_BYTES[parallel.exp_avg_sq_dtype]
    return FsdpBytes(param=param, main_params=main_params, main_grads=main_grads, grad_comm=grad_comm,
                     gather=1.0 if parallel.fp8_param_gather else param, adam_states=adam)


def fsdp_bytes_per_param(parallel: ParallelConfig, shard: int, optim_shard: int | None = None
                         ) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter on one rank, sharded over ``shard`` ranks
    (``optim_shard``: the main weights' and states' shard group, when larger: HSDP outer ``optim``)."""
    b, strategy = fsdp_bytes(parallel), parallel.data_parallel_sharding_strategy
    weights, grads, optimizer = b.param, b.main_grads, b.main_params + b.adam_states
    if strategy != "no_shard":
        optimizer /= optim_shard or shard
    if strategy in ("optim_grads", "optim_grads_params"):
        grads /= shard
    if strategy == "optim_grads_params":
        weights /= shard
    return weights, grads, optimizer


def fsdp_buffer_bytes(parallel: ParallelConfig, unit_params: float) -> float:
    """The unsharded working buffers of ``BUFFERED_UNITS`` units of ``unit_params`` parameters each."""
    b, strategy = fsdp_bytes(parallel), parallel.data_parallel_sharding_strategy
    per_param = (b.gather if strategy == "optim_grads_params" else 0.0) \
        + (b.grad_comm if strategy in ("optim_grads", "optim_grads_params") else 0.0)
    return BUFFERED_UNITS * unit_params * per_param


def fsdp_stage_bytes(parallel: ParallelConfig, *, params: int, expert_params: int, unit_params: float,
                     dense_shard: int, optim_shard: int, expert_shard: int) -> tuple[float, float, float, float]:
    """(weights, gradients, optimizer, working buffers) bytes of one rank holding ``params`` parameters, of
    them ``expert_params`` routed experts (sharded over the expert-data-parallel group ``expert_shard``)."""
    dense = params - expert_params
    w, g, o = fsdp_bytes_per_param(parallel, dense_shard, optim_shard)
    ew, eg, eo = fsdp_bytes_per_param(parallel, expert_shard)
    return (w * dense + ew * expert_params, g * dense + eg * expert_params, o * dense + eo * expert_params,
            fsdp_buffer_bytes(parallel, unit_params))
