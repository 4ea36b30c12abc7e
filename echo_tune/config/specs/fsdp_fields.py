"""The Megatron-FSDP / torch FSDP2 fields of ParallelConfig (Megatron-LM d98e8a64ddf3 training/arguments.py,
core/distributed/fsdp/; mechanics in sim/data_parallel/fsdp.py, rules in config/rules/fsdp_rules.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class FsdpFields:
    use_megatron_fsdp: bool = False
    """``--use-megatron-fsdp``: Megatron-FSDP shards parameters, gradients and optimizer states over DP x CP as
    ``data_parallel_sharding_strategy`` says (v1 turns on the distributed optimizer, arguments.py)."""

    use_torch_fsdp2: bool = False
    """``--use-torch-fsdp2``: PyTorch's FSDP2 ``fully_shard`` on every transformer layer and the root over DP x CP
    (core/distributed/torch_fully_sharded_data_parallel.py, resharded after forward): the per-layer all-gathers and
    reduce-scatters of Megatron-FSDP's optim_grads_params, as which it is simulated (config/rules/fsdp_rules.py)."""

    data_parallel_sharding_strategy: str = "optim_grads_params"
    """``--data-parallel-sharding-strategy``: no_shard | optim | optim_grads | optim_grads_params (ZeRO-0..3)."""

    outer_dp_sharding_strategy: str = "no_shard"
    """``--outer-dp-sharding-strategy``: HSDP (``--num-distributed-optimizer-instances`` > 1) outer group: no_shard
    (replicas, gradient shards all-reduced across them) or optim (optimizer states sharded across them too)."""

    megatron_fsdp_main_params_dtype: str = "fp32"
    """``--megatron-fsdp-main-params-dtype``: fp32 | bf16 | fp16 | auto (auto: no main copy, the model weights)."""

    megatron_fsdp_main_grads_dtype: str = "auto"
    """``--megatron-fsdp-main-grads-dtype``: fp32 | bf16 | fp16 | auto (auto: the model's parameter dtype)."""

    megatron_fsdp_grad_comm_dtype: str = "auto"
    """``--megatron-fsdp-grad-comm-dtype``: fp32 | bf16 | fp16 | auto (auto: the main-grads dtype)."""

    fsdp_double_buffer: bool = False
    """``--fsdp-double-buffer``: two fixed communication buffers reused by every FSDP unit (Megatron-FSDP)."""

    nccl_ub: bool = False
    """``--use-nccl-ub``: NCCL user-buffer registration of the FSDP buffers (turns on ``fsdp_double_buffer``)."""

    suggested_communication_unit_size: int | None = None
    """``--suggested-communication-unit-size``: Megatron-FSDP's pipelines in parameter elements: the all-gather
    prefetches up to half of it ahead, the reduce-scatter queue holds up to it (megatron_fsdp.py; None: at least
    1e9). echo-tune keeps one unit in flight each way (sim/data_parallel/fsdp.py), what the pipelines do when a unit holds at
    least half the size; smaller units prefetch deeper, which the report says."""
