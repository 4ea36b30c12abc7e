"""``auto`` for the recipe features (search/space/features.py): the values each can take for a model on a cluster.

- ``fp8_recipe``: delayed and tensorwise (per-tensor current scaling, Megatron-Bridge's "FP8-CS") on every FP8 GPU,
  and mxfp8 where the GPU is Blackwell (compute capability 10 or more; Megatron-LM d98e8a64ddf3
  transformer_config.py: MXFP8 needs Blackwell); blockwise can be listed;
- ``moe_token_dispatcher_type``: alltoall and allgather, and flex where echo-tune has the flex kernels' measured
  bandwidth for the GPU (cost/data/flex-dispatch-nvlink.yaml ``platform_of``: Hopper and Blackwell, which DeepEP
  and HybridEP run on); ``moe_flex_dispatcher_backend``: deepep and hybridep;
- ``recompute_modules`` (with selective recompute): Megatron's default (core_attn), and the sets recipes use for
  the model's layers: mla_up_proj and mla_up_proj + mlp with multi-latent attention (DeepSeek-V3's recipe), mlp
  where some layers are dense, moe_act and layernorm + moe_act for MoE (Megatron-Bridge's Qwen3 / GPT-OSS recipes),
  and all of these together (the most memory selective recompute can save);
- ``cuda_graph_impl``: none and transformer_engine; ``cuda_graph_modules``: the whole layer (dense) or attention,
  and for MoE attention with the router and the dispatch preprocessing (Megatron-Bridge's MoE recipes' scope).
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from echo_tune.config.load.loading import read_yaml


@lru_cache(maxsize=1)
def _flex_gpus() -> frozenset:
    """The GPUs cost/data/flex-dispatch-nvlink.yaml maps to a measured platform (``platform_of``)."""
    path = Path(str(resources.files("echo_tune.cost").joinpath("data", "flex-dispatch-nvlink.yaml")))
    return frozenset(read_yaml(path, "flex dispatcher NVLink bandwidths").get("platform_of") or {})


def flex_runs_on(cluster) -> bool:
    """Whether the flex dispatcher's bandwidth is known for the cluster's GPU (its platform measured or mapped)."""
    return cluster.gpu.name in _flex_gpus()


def _blackwell(cluster) -> bool:
    try:
        return float(cluster.gpu.compute_capability or 0) >= 10.0
    except ValueError:
        return False


def _fp8_recipes(model, cluster) -> tuple:
    return ("delayed", "tensorwise") + (("mxfp8",) if _blackwell(cluster) else ())


def _dispatchers(model, cluster) -> tuple:
    if not model.is_moe:
        return (model.moe_token_dispatcher_type,)
    return ("alltoall", "allgather") + (("flex",) if flex_runs_on(cluster) else ())


def _backends(model, cluster) -> tuple:
    return ("deepep", "hybridep") if model.is_moe and flex_runs_on(cluster) else (model.moe_flex_dispatcher_backend,)


def _recompute_modules(model, cluster) -> tuple:
    sets: list = [None]
    dense_layers = 0 in model.moe_pattern
    if model.multi_latent_attention:
        sets += ["mla_up_proj"] + (["mla_up_proj mlp"] if dense_layers else [])
    if dense_layers:
        sets.append("mlp")
    if model.is_moe:
        sets += ["moe_act", "layernorm moe_act"]
    every = " ".join(dict.fromkeys(m for s in sets if s for m in s.split()))
    if every and set(every.split()) not in [set(s.split()) for s in sets if s]:  # all of them (a set: the order
        sets.append(every)  # of the modules means nothing to Megatron): the most memory selective recompute saves
    return tuple(sets)


def _cuda_graph_impls(model, cluster) -> tuple:
    return ("none", "transformer_engine")


def _cuda_graph_modules(model, cluster) -> tuple:
    return ("attn", "attn moe_router moe_preprocess") if model.is_moe else (None, "attn")


FEATURE_AUTO = {"fp8_recipe": _fp8_recipes, "moe_token_dispatcher_type": _dispatchers,
                "moe_flex_dispatcher_backend": _backends, "recompute_modules": _recompute_modules,
                "cuda_graph_impl": _cuda_graph_impls, "cuda_graph_modules": _cuda_graph_modules}
"""Field -> (model, cluster) -> its values (the boolean features take false and true, as every boolean does)."""
