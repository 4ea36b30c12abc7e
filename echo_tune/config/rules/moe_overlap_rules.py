"""Megatron-Core's rules for the EP all-to-all overlap (``--overlap-moe-expert-parallel-comm``) and delayed
weight gradients (``--delay-wgrad-compute``): megatron/core/transformer/transformer_config.py
``__post_init__``, NVIDIA/Megatron-LM commit d98e8a64ddf3 (the torch / TE version asserts are not modelled)."""

from __future__ import annotations

from echo_tune.config._checks import require
from echo_tune.config.specs.pipeline_layout import num_virtual_stages


def check_moe_overlap(model, parallel) -> None:
    """Raise ConfigError for an EP-overlap setting Megatron refuses."""
    if parallel.delay_wgrad_compute:
        require(parallel.overlap_moe_expert_parallel_comm,
                "`delay_wgrad_compute` needs `overlap_moe_expert_parallel_comm`, but got "
                "(overlap_moe_expert_parallel_comm=False); add --overlap-moe-expert-parallel-comm")
    if not parallel.overlap_moe_expert_parallel_comm:
        return
    ep, pp = parallel.expert_model_parallel_size, parallel.pipeline_model_parallel_size
    vpp = parallel.virtual_pipeline_model_parallel_size or parallel.num_layers_per_virtual_pipeline_stage
    if vpp is None and parallel.pipeline_model_parallel_layout:  # the layout sets VPP (arguments.py)
        chunks = num_virtual_stages(parallel.pipeline_model_parallel_layout) // pp
        vpp = chunks if chunks > 1 else None
    require(pp == 1 or vpp is not None,
            f"`overlap_moe_expert_parallel_comm` with `pipeline_model_parallel_size > 1` needs a virtual pipeline, "
            f"but got (pipeline_model_parallel_size={pp}, virtual_pipeline_model_parallel_size=None); add "
            f"--num-virtual-stages-per-pipeline-rank")
    require(model.is_moe and ep > 1, f"`overlap_moe_expert_parallel_comm` needs expert parallelism, but got "
                                     f"(expert_model_parallel_size={ep}); set --expert-model-parallel-size > 1")
    require(model.moe_token_dispatcher_type in ("alltoall", "flex"),
            f"`overlap_moe_expert_parallel_comm` needs the alltoall or flex dispatcher, but got "
            f"(moe_token_dispatcher_type={model.moe_token_dispatcher_type!r}); "
            "use --moe-token-dispatcher-type alltoall")
    require(parallel.recompute_granularity != "full" and parallel.recompute_method is None
            and parallel.recompute_num_layers is None,
            f"`overlap_moe_expert_parallel_comm` refuses full recompute, a recompute method and layer count, but "
            f"got (recompute_granularity={parallel.recompute_granularity!r}, recompute_method="
            f"{parallel.recompute_method!r}, recompute_num_layers={parallel.recompute_num_layers!r}); drop them")
    require("moe" not in (parallel.recompute_modules or ()),
            "`overlap_moe_expert_parallel_comm` refuses `moe` in recompute_modules, but got it; drop it")
    require(parallel.precision in ("bf16", "fp16"),
            f"`overlap_moe_expert_parallel_comm` needs a bf16 or fp16 model, but got (precision="
            f"{parallel.precision!r}); add --bf16")
    require(not model.moe_shared_expert_overlap,
            "`overlap_moe_expert_parallel_comm` and `moe_shared_expert_overlap` exclude each other, but both "
            "are set; drop --moe-shared-expert-overlap")
    require(model.mtp_num_layers in (None, 0, 1),
            f"`overlap_moe_expert_parallel_comm` supports at most one MTP layer, but got (mtp_num_layers="
            f"{model.mtp_num_layers}); use --mtp-num-layers 1")
