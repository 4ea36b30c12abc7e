"""Megatron's rules on activation offloading to the host (``--cpu-offloading-num-layers``; sim/features/cpu_offload.py).

From Megatron-LM d98e8a64ddf3 core/transformer/transformer_config.py ``__post_init__`` (``cpu_offloading`` is set
by training/arguments.py for N > 0) and transformer_block.py (Transformer Engine's offload context).
"""

from __future__ import annotations

from echo_tune.config._checks import require
from echo_tune.config.rules.schedule_rules import cuda_graph_setting
from echo_tune.config.flags.unmodelled import UnmodelledError


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


OFFLOAD_MODULES = ("core_attn", "attn_proj", "expert_fc1", "fused_group_mlp", "moe_act", "attn_norm", "mlp_norm",
                   "qkv_linear", "gdp_qkv")
"""Megatron-LM d98e8a64ddf3 transformer_config.py ``allowed_modules`` of ``offload_modules``."""


def check_fine_grained_offload(model, parallel) -> None:
    """Megatron's rules on ``--fine-grained-activation-offloading`` (transformer_config.py ``__post_init__``), and
    what echo-tune does not model beside it (sim/features/activation_offload.py)."""
    if not parallel.fine_grained_activation_offloading:
        return
    modules = tuple(parallel.offload_modules or ())
    require(bool(modules), "--fine-grained-activation-offloading needs --offload-modules (Megatron-LM asserts "
                           "offload_modules is not empty); add e.g. --offload-modules core_attn attn_proj")
    bad = sorted(set(modules) - set(OFFLOAD_MODULES))
    require(not bad, f"Invalid choices for offload_modules: {bad} (Megatron-LM allows {', '.join(OFFLOAD_MODULES)})")
    require("attn_proj" not in modules or "core_attn" in modules,
            "attn_proj cannot be set to offload_modules alone without core_attn (its input is core attention's "
            "output, which core attention's backward needs; Megatron-LM); add core_attn")
    require(not parallel.cpu_offloading_num_layers, "fine_grained_activation_offloading cannot be enabled with "
                                                    "cpu_offloading (Megatron-LM); drop --cpu-offloading-num-layers")
    recomputed = parallel.recompute_modules or () if parallel.recompute_granularity == "selective" else ()
    inside_moe = sorted({"moe_act", "expert_fc1", "fused_group_mlp"} & set(modules))
    require("moe" not in recomputed or not inside_moe,
            f"Cannot offload {inside_moe} while recomputing the entire MoE layer (Megatron-LM); remove 'moe' from "
            f"--recompute-modules or those from --offload-modules")
    unmodelled = [m for m in modules if m in ("fused_group_mlp", "gdp_qkv")]
    if unmodelled:
        raise UnmodelledError(f"`--offload-modules {' '.join(unmodelled)}` is not modelled (the TE op fuser's whole "
                              f"grouped MLP, the gated delta product's QKV); remove it")
    if cuda_graph_setting(parallel)[0] != "none":
        raise UnmodelledError("fine-grained activation offloading beside CUDA graphs (offloads captured in the graphs "
                              "or deferred to their replay) is not modelled; drop one")
