"""Megatron's rules on activation offloading to the host (``--cpu-offloading-num-layers``; sim/cpu_offload.py).

From Megatron-LM d98e8a64ddf3 core/transformer/transformer_config.py ``__post_init__`` (``cpu_offloading`` is set
by training/arguments.py for N > 0) and transformer_block.py (Transformer Engine's offload context).
"""

from __future__ import annotations

from echo_tune.config._checks import require


def check_cpu_offload(model, parallel) -> None:
    """Raise ConfigError for an offloading setting Megatron rejects."""
    n = parallel.cpu_offloading_num_layers
    require(isinstance(n, int) and 0 <= n < model.num_layers,
            f"`0 <= cpu_offloading_num_layers < num_layers` must hold (CPU offloading can be done only for layers "
            f"less than num_layers), but got (cpu_offloading_num_layers={n}, num_layers={model.num_layers})")
    if n == 0:
        return
    require(parallel.pipeline_model_parallel_size == 1,
            f"CPU offloading does not support pipeline parallelism (Megatron-Core), but got "
            f"(pipeline_model_parallel_size={parallel.pipeline_model_parallel_size}); use "
            f"--pipeline-model-parallel-size 1 or drop --cpu-offloading-num-layers")
    require(parallel.recompute_granularity is None,
            f"CPU offloading does not work with activation recomputation (Megatron-Core), but got "
            f"(recompute_granularity={parallel.recompute_granularity!r}); drop --recompute-granularity or "
            f"--cpu-offloading-num-layers")
    require(model.transformer_impl == "transformer_engine",
            f"CPU offloading needs Transformer Engine (its offload context), but got (transformer_impl="
            f"{model.transformer_impl!r}); use --transformer-impl transformer_engine")
