"""Megatron-FSDP's rules on its settings, and the settings it implies (Megatron-LM d98e8a64ddf3).

From training/arguments.py (``validate_args``, the ``if args.use_megatron_fsdp:`` block and the argument
definitions in ``_add_distributed_args`` / ``_add_mixed_precision_args``) and
core/distributed/fsdp/mcore_fsdp_adapter.py. Megatron-FSDP v1 (``--megatron-fsdp-version 1``, the default)
turns on the distributed optimizer itself, and ``--use-nccl-ub`` turns on ``--fsdp-double-buffer``.
"""

from __future__ import annotations

from echo_tune.config._checks import require, require_choice
from echo_tune.config.specs.parallel import ParallelConfig

SHARDING_STRATEGIES = ("no_shard", "optim", "optim_grads", "optim_grads_params")
"""``--data-parallel-sharding-strategy`` choices (arguments.py)."""
OUTER_SHARDING_STRATEGIES = ("no_shard", "optim")
"""``--outer-dp-sharding-strategy`` choices (arguments.py)."""
FSDP_DTYPES = ("fp32", "bf16", "fp16", "auto")
"""Choices of ``--megatron-fsdp-main-params-dtype`` / ``-main-grads-dtype`` / ``-grad-comm-dtype``."""


def check_fsdp(parallel: ParallelConfig) -> ParallelConfig:
    """Raise ConfigError for a Megatron-FSDP setting Megatron rejects; return the settings in effect."""
    require(not parallel.nccl_ub or parallel.use_megatron_fsdp,
            "`use_nccl_ub` is modelled only with use_megatron_fsdp (there it registers the FSDP buffers), but "
            "got (nccl_ub=True, use_megatron_fsdp=False); add --use-megatron-fsdp or drop --use-nccl-ub")
    require(not parallel.fsdp_double_buffer or parallel.use_megatron_fsdp,
            "`fsdp_double_buffer` needs use_megatron_fsdp, but got (fsdp_double_buffer=True, "
            "use_megatron_fsdp=False); add --use-megatron-fsdp or drop --fsdp-double-buffer")
    if parallel.use_torch_fsdp2:  # training/arguments.py validate_args
        problems = [rule for rule, ok in (
            ("no pipeline parallelism", parallel.pipeline_model_parallel_size == 1),
            ("no expert parallelism", parallel.expert_model_parallel_size == 1),
            ("not with MCore's distributed optimizer", not parallel.use_distributed_optimizer),
            ("no gradient accumulation fusion (--no-gradient-accumulation-fusion)", not parallel.gradient_accumulation_fusion),
            ("not with Megatron-FSDP", not parallel.use_megatron_fsdp),
            ("bf16, not fp16", parallel.precision != "fp16")) if not ok]
        require(not problems, f"--use-torch-fsdp2 needs {'; '.join(problems)} (Megatron-LM validate_args), but the "
                              f"layout has them otherwise; change those settings or drop --use-torch-fsdp2")
        # simulated as Megatron-FSDP's ZeRO-3 over DP x CP: per-layer all-gathers before forward and backward,
        # per-layer reduce-scatters of the gradients, sharded optimizer states (its own bf16 buffers)
        parallel = parallel.replace(use_megatron_fsdp=True, data_parallel_sharding_strategy="optim_grads_params")
    size = parallel.suggested_communication_unit_size
    require(size is None or parallel.use_megatron_fsdp,
            f"`suggested_communication_unit_size` is a Megatron-FSDP setting, but got (suggested_communication_unit_size="
            f"{size}, use_megatron_fsdp=False); add --use-megatron-fsdp or drop --suggested-communication-unit-size")
    require(size is None or size > 0, f"`suggested_communication_unit_size > 0` must hold, but got "
                                      f"(suggested_communication_unit_size={size})")
    if not parallel.use_megatron_fsdp:
        return parallel
    require_choice("data_parallel_sharding_strategy", parallel.data_parallel_sharding_strategy, SHARDING_STRATEGIES)
    require_choice("outer_dp_sharding_strategy", parallel.outer_dp_sharding_strategy, OUTER_SHARDING_STRATEGIES)
    for name in ("megatron_fsdp_main_params_dtype", "megatron_fsdp_main_grads_dtype",
                 "megatron_fsdp_grad_comm_dtype"):
        require_choice(name, getattr(parallel, name), FSDP_DTYPES)
    # arguments.py, --outer-dp-sharding-strategy help: "optim" only with optim_grads_params
    require(parallel.outer_dp_sharding_strategy == "no_shard"
            or parallel.data_parallel_sharding_strategy == "optim_grads_params",
            f"`outer_dp_sharding_strategy == 'optim'` needs data_parallel_sharding_strategy == "
            f"'optim_grads_params', but got (data_parallel_sharding_strategy="
            f"{parallel.data_parallel_sharding_strategy!r}); use --data-parallel-sharding-strategy "
            f"optim_grads_params or --outer-dp-sharding-strategy no_shard")
    double_buffer = parallel.fsdp_double_buffer or parallel.nccl_ub  # arguments.py: nccl_ub sets it
    # mcore_fsdp_adapter.py: "1F1B overlap with FSDP does not support double buffer"
    require(not (parallel.overlap_moe_expert_parallel_comm and double_buffer),
            f"`overlap_moe_expert_parallel_comm` with Megatron-FSDP does not support its double buffer, but got "
            f"(fsdp_double_buffer={parallel.fsdp_double_buffer}, nccl_ub={parallel.nccl_ub}); drop "
            f"--fsdp-double-buffer / --use-nccl-ub or --overlap-moe-expert-parallel-comm")
    # the optimizer is Adam (the only one modelled), which Megatron-FSDP supports
    return parallel.replace(use_distributed_optimizer=True, fsdp_double_buffer=double_buffer)
