"""Rules of the schedule / step features: CUDA graphs, param-gather overlap with the optimizer step, deferred
embedding wgrad, partial distributed optimizer.

Each rule is one of Megatron-LM's own asserts at d98e8a64ddf3 (file named at the rule), so that a layout
Megatron refuses is refused here, by a one-line ConfigError. ``cuda_graph_setting`` applies Megatron's
migrations of the deprecated spellings (training/arguments.py ``validate_args`` and
core/transformer/cuda_graph_config.py) and returns what is captured.
"""

from __future__ import annotations

from echo_tune.config._checks import require
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig

# core/transformer/enums.py CudaGraphModule, plus the deprecated values _parse_cuda_graph_modules_arg accepts
CUDA_GRAPH_MODULES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")
DEPRECATED_MODULES = ("full", "full_iteration", "full_iteration_inference")


def cuda_graph_setting(parallel: ParallelConfig) -> tuple[str, tuple[str, ...]]:
    """(implementation, captured modules) as Megatron resolves them; () modules = the whole layer. Resolved
    once per step, into the checked ``Layout.cuda_graphs`` (config/rules/compatibility.py), which the simulator reads:

    - ``--enable-cuda-graph`` / ``--external-cuda-graph`` become local / transformer_engine and refuse an
      explicit ``--cuda-graph-impl`` (arguments.py: "Do not use --enable-cuda-graph or --external-cuda-graph
      with --cuda-graph-impl.").
    - ``--cuda-graph-scope`` is ``--cuda-graph-modules``' old name; the two refuse each other.
    - ``full`` (alone) is the whole layer; ``full_iteration`` sets ``cuda_graph_impl = full_iteration`` (from
      none, local or full_iteration; cuda_graph_config.py get_deprecated_cuda_graph_modules_migration);
      ``full_iteration_inference`` concerns inference only.
    """
    impl = parallel.cuda_graph_impl
    if parallel.enable_cuda_graph or parallel.external_cuda_graph:
        require(impl == "none", f"--enable-cuda-graph / --external-cuda-graph replace `--cuda-graph-impl`, but got "
                                f"(cuda_graph_impl={impl!r}); drop one of them")
        require(not (parallel.enable_cuda_graph and parallel.external_cuda_graph),
                "--enable-cuda-graph and --external-cuda-graph cannot be enabled at the same time; drop one")
        impl = "local" if parallel.enable_cuda_graph else "transformer_engine"
    require(parallel.cuda_graph_scope is None or not parallel.cuda_graph_modules,
            f"--cuda-graph-scope and --cuda-graph-modules cannot be used together, but got "
            f"(cuda_graph_scope={list(parallel.cuda_graph_scope or [])}, "
            f"cuda_graph_modules={list(parallel.cuda_graph_modules or [])}); keep --cuda-graph-modules")
    raw = tuple(parallel.cuda_graph_scope or parallel.cuda_graph_modules or ())
    for module in raw:
        require(module in CUDA_GRAPH_MODULES + DEPRECATED_MODULES,
                f"`cuda_graph_modules` entry {module!r} is not a CUDA graph module; use one of "
                f"{', '.join(CUDA_GRAPH_MODULES)}")
    require("full" not in raw or raw == ("full",), f"full scope cannot be used with other scopes, but got "
                                                   f"(cuda_graph_modules={list(raw)})")
    deprecated = sorted({m for m in raw if m in ("full_iteration", "full_iteration_inference")})
    require(len(deprecated) <= 1, f"cuda_graph_modules cannot contain several deprecated values, but got {deprecated}")
    if "full_iteration" in deprecated:
        require(impl in ("none", "local", "full_iteration"),
                f"cuda_graph_modules='full_iteration' cannot be combined with (cuda_graph_impl={impl!r})")
        impl = "full_iteration"
    modules = tuple(m for m in raw if m in CUDA_GRAPH_MODULES)
    if impl == "local" and {"moe_router", "moe_preprocess"} & set(modules):
        # transformer_config.py: the local implementation captures router and preprocess together
        modules += tuple(m for m in ("moe_router", "moe_preprocess") if m not in modules)
    return impl, modules


def _moe_layers_present(model: ModelSpec) -> tuple[bool, bool]:
    """(has dense layers, has MoE layers)."""
    if not model.is_moe:
        return True, False
    pattern = model.moe_pattern
    return 0 in pattern, 1 in pattern


def check_cuda_graphs(model: ModelSpec, parallel: ParallelConfig) -> tuple[str, tuple[str, ...]]:
    """core/transformer/transformer_config.py ``__post_init__`` (CUDA graph block) and arguments.py."""
    impl, modules = cuda_graph_setting(parallel)
    if impl == "none":
        return impl, modules
    require(impl != "full_iteration" or not modules,
            f"--cuda-graph-modules must be empty when cuda_graph_impl='full_iteration', but got "
            f"(cuda_graph_modules={list(modules)})")
    dense, moe = _moe_layers_present(model)
    require(not ("moe" in modules and "moe_router" in modules),
            "cuda_graph_modules must not contain both moe and moe_router; keep one")
    require("moe_preprocess" not in modules or "moe_router" in modules,
            "the moe_preprocess CUDA graph is only supported with the moe_router CUDA graph; add moe_router")
    if not moe:
        require("moe" not in modules and "moe_router" not in modules,
                f"the moe / moe_router CUDA graphs are only supported for MoE models, but got "
                f"(cuda_graph_modules={list(modules)}, num_experts={model.num_experts})")
    else:
        require(dense or "mlp" not in modules,
                "the mlp CUDA graph captures dense layers, but every layer of the model is MoE; use moe or moe_router")
        drop_pad = model.moe_expert_capacity_factor is not None and model.moe_pad_expert_input_to_capacity
        require(drop_pad or "moe" not in modules,
                "the moe CUDA graph is only supported with drop-and-pad MoE; set --moe-expert-capacity-factor and "
                "--moe-pad-expert-input-to-capacity, or capture moe_router instead")
        # docs/user-guide/features/cuda_graph.md: whole-layer capture is "not working for MoE dynamic shapes"
        # (dropless routing copies token counts to the host: the DtoH copies transformer_config.py names)
        whole = impl == "full_iteration" or not modules
        require(drop_pad or not whole,
                f"capturing whole MoE layers (cuda_graph_impl={impl!r}, no --cuda-graph-modules) needs static "
                f"shapes, i.e. drop-and-pad MoE; capture `--cuda-graph-modules attn moe_router moe_preprocess` "
                f"or set --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity")
    if parallel.recompute_granularity == "full":
        require(impl == "full_iteration", f"full recompute is only supported with the full-iteration CUDA graph, but "
                                          f"got (cuda_graph_impl={impl!r}); use --cuda-graph-impl full_iteration")
    if parallel.recompute_granularity == "selective":
        full = impl == "full_iteration" or not modules
        recomputed = parallel.recompute_modules or ("core_attn",)
        require(model.attention_dropout == 0.0 or "core_attn" not in recomputed or not (full or "attn" in modules),
                f"attention dropout is not supported with graphed attention recomputation, but got "
                f"(attention_dropout={model.attention_dropout}); set --attention-dropout 0.0")
        mlp_graphed = full or "mlp" in modules or "moe" in modules
        require(model.hidden_dropout == 0.0 or not mlp_graphed or not {"mlp", "moe"} & set(recomputed),
                f"hidden dropout is not supported with graphed MLP/MoE recomputation, but got "
                f"(hidden_dropout={model.hidden_dropout}); set --hidden-dropout 0.0")
    return impl, modules


def check_schedule_features(model: ModelSpec, parallel: ParallelConfig, data_parallel_size: int,
                            virtual_pipeline_size: int) -> None:
    """Every rule of the schedule / step features (called by ``check_compatible``)."""
    check_cuda_graphs(model, parallel)
    if parallel.overlap_param_gather_with_optimizer_step:  # training/arguments.py validate_args
        require(parallel.use_distributed_optimizer and parallel.overlap_param_gather,
                f"--overlap-param-gather-with-optimizer-step needs the distributed optimizer and "
                f"--overlap-param-gather, but got (use_distributed_optimizer={parallel.use_distributed_optimizer}, "
                f"overlap_param_gather={parallel.overlap_param_gather}); add them")
        require(virtual_pipeline_size > 1,
                "--overlap-param-gather-with-optimizer-step is only supported with interleaved pipeline parallelism; "
                "set --num-virtual-stages-per-pipeline-rank")
    if parallel.defer_embedding_wgrad_compute:  # core/model_parallel_config.py __post_init__
        require(parallel.pipeline_model_parallel_size > 1,
                "cannot defer embedding wgrad compute when pipeline model parallel is not used, but got "
                "(pipeline_model_parallel_size=1); drop --defer-embedding-wgrad-compute")
    n, dp_cp = parallel.num_distributed_optimizer_instances, data_parallel_size * parallel.context_parallel_size
    require(dp_cp % n == 0,
            f"`(data_parallel_size * context_parallel_size) % num_distributed_optimizer_instances == 0` must hold "
            f"(core/parallel_state.py), but got (data_parallel_size={data_parallel_size}, "
            f"context_parallel_size={parallel.context_parallel_size}, num_distributed_optimizer_instances={n})")


def userbuffer_overlap(model: ModelSpec, parallel: ParallelConfig) -> bool:
    """Whether ``--tp-comm-overlap`` is on and reaches the TE linears (``userbuffers_reach_linears``)."""
    return parallel.tp_comm_overlap and userbuffers_reach_linears(model)


def userbuffers_reach_linears(model: ModelSpec) -> bool:
    """Whether ``--tp-comm-overlap`` can reach the TE linears. Not with multi-latent attention: Megatron-LM's
    ``TELinear.__init__`` (core/extensions/transformer_engine.py at d98e8a64ddf3) sets
    ``self.config.tp_comm_overlap = False`` on the TransformerConfig every module shares when it builds a linear
    whose buffer name is not qkv / proj / fc1 / fc2, and MLA's first such projection (q_down_proj, q_proj or
    kv_down_proj) is built in the first layer, before its MLP and every later layer: only that layer's attention
    output projection keeps userbuffers, which is left out."""
    return not model.multi_latent_attention


def userbuffer_notes(model: ModelSpec, parallel: ParallelConfig) -> tuple[str, ...]:
    if parallel.tp_comm_overlap and not userbuffer_overlap(model, parallel):
        return ("--tp-comm-overlap with multi-latent attention: Megatron-LM's TELinear turns TP overlap off on the "
                "shared TransformerConfig when it builds MLA's down projection (buffer name not qkv/proj/fc1/fc2), "
                "so no layer after it uses userbuffers; simulated without them",)
    return ()
