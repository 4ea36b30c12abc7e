"""Layout labels that show every setting that can differ between two layouts of one search."""

from __future__ import annotations


def full_label(cfg: dict, dp: int | None = None) -> str:
    """TP4 PP8 CP2 DP4 EP8 ETP1 VPP5 mbs1 recompute=selective SP DistOpt TPoverlap DPoverlap fp8=hybrid.

    Unlike the search table's short label, nothing that differs is left out: recompute ``none`` is written,
    and so is every overlap flag and the FP8 format.
    """
    parts = [f"TP{cfg.get('tensor_model_parallel_size', 1)}", f"PP{cfg.get('pipeline_model_parallel_size', 1)}",
             f"CP{cfg.get('context_parallel_size', 1)}"]
    if dp is not None:
        parts.append(f"DP{dp}")
    if cfg.get("expert_model_parallel_size", 1) > 1:
        parts.append(f"EP{cfg['expert_model_parallel_size']}")
    if cfg.get("expert_tensor_parallel_size") is not None:
        parts.append(f"ETP{cfg['expert_tensor_parallel_size']}")
    if cfg.get("virtual_pipeline_model_parallel_size"):
        parts.append(f"VPP{cfg['virtual_pipeline_model_parallel_size']}")
    for key, short in (("decoder_first_pipeline_num_layers", "first"), ("decoder_last_pipeline_num_layers", "last")):
        if cfg.get(key) is not None:
            parts.append(f"{short}{cfg[key]}")
    for key, short in (("account_for_embedding_in_pipeline_split", "splitE"),
                       ("account_for_loss_in_pipeline_split", "splitL")):
        if cfg.get(key):
            parts.append(short)
    if cfg.get("pipeline_model_parallel_layout"):
        parts.append(f"layout={cfg['pipeline_model_parallel_layout']}")
    parts.append(f"mbs{cfg.get('micro_batch_size', 1)}")
    recompute = cfg.get("recompute_granularity")
    if recompute == "full":
        parts.append(f"recompute=full-{cfg.get('recompute_method') or 'uniform'}{cfg.get('recompute_num_layers') or 1}")
    else:
        parts.append(f"recompute={recompute or 'none'}")
    for key, short in (("sequence_parallel", "SP"), ("use_distributed_optimizer", "DistOpt"),
                       ("tp_comm_overlap", "TPoverlap"), ("overlap_grad_reduce", "GradOverlap"),
                       ("overlap_param_gather", "ParamOverlap"), ("fp8_param_gather", "FP8gather")):
        parts.append(short if cfg.get(key) else f"no{short}")
    if cfg.get("fp8_format"):
        parts.append(f"fp8={cfg['fp8_format']}" + (f"/{cfg['fp8_recipe']}" if cfg.get("fp8_recipe") else ""))
    return " ".join(parts + feature_tokens(cfg))


def feature_tokens(cfg: dict) -> list[str]:
    """The recipe features of a layout (search/space/features.py) as label tokens: recomputed modules, dispatcher, the
    EP, shared-expert and optimizer-step overlaps, CUDA graphs (each only where the layout has it)."""
    out = []
    modules = cfg.get("recompute_modules")
    if cfg.get("recompute_granularity") == "selective" and modules:
        out.append("modules=" + "+".join(modules))
    moe = cfg.get("expert_model_parallel_size", 1) > 1 or (cfg.get("expert_tensor_parallel_size") or 1) > 1
    dispatcher = cfg.get("moe_token_dispatcher_type")
    if moe and dispatcher:
        out.append(cfg.get("moe_flex_dispatcher_backend", "flex") if dispatcher == "flex" else
                   {"alltoall": "a2a", "allgather": "allgather"}.get(dispatcher, dispatcher))
    if moe:
        out.append("EPoverlap" + ("+delay" if cfg.get("delay_wgrad_compute") else "")
                   if cfg.get("overlap_moe_expert_parallel_comm") else "noEPoverlap")
    for key, short in _FEATURE_FLAGS:
        if cfg.get(key):
            out.append(short)
    impl = cfg.get("cuda_graph_impl")
    if impl and impl != "none":
        graphs = cfg.get("cuda_graph_modules") or cfg.get("cuda_graph_scope")
        out.append(f"graphs={impl}" + (":" + "+".join(graphs) if graphs else ""))
    return out


_FEATURE_FLAGS = (("moe_shared_expert_overlap", "SharedOverlap"),
                  ("overlap_param_gather_with_optimizer_step", "OptStepOverlap"))
_FLAGS = (("sequence_parallel", "SP"), ("use_distributed_optimizer", "DistOpt"), ("tp_comm_overlap", "TPoverlap"),
          ("overlap_grad_reduce", "GradOverlap"), ("overlap_param_gather", "ParamOverlap"),
          ("fp8_param_gather", "FP8gather"))


def short_labels(configs: list[dict], dps: list[int | None]) -> tuple[list[str], str]:
    """Labels for several layouts shown together, and one line of the on/off settings they all share.

    Sizes, micro-batch and recompute are always written; an on/off flag is written (as ``X`` or ``noX``) only
    when it differs between the layouts, so two rows never print the same label for different settings.
    """
    full = [full_label(c, d).split() for c, d in zip(configs, dps)]
    shared_tokens = [short for key, short in _FLAGS]
    varying = {short for key, short in _FLAGS if len({bool(c.get(key)) for c in configs}) > 1}
    labels = [" ".join(t for t in toks if t.removeprefix("no") not in shared_tokens
                       or t.removeprefix("no") in varying) for toks in full]
    common = [short if configs and configs[0].get(key) else f"no{short}" for key, short in _FLAGS
              if short not in varying] if configs else []
    return labels, " ".join(common)
