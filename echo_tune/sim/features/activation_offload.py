"""Fine-grained activation offloading: ``--fine-grained-activation-offloading --offload-modules ...``.

Megatron-LM d98e8a64ddf3 core/pipeline_parallel/fine_grained_activation_offload.py (``PipelineOffloadManager``,
``ChunkOffloadHandler``) and docs/user-guide/features/fine_grained_activation_offloading.md: each listed submodule's
forward runs inside an offload group whose saved-tensor hook takes every tensor it saves for backward (of at least
``--min-offloaded-tensor-size`` = 2^20 elements); the group is copied to pinned host memory on a side stream once
the module is done, and copied back ahead of the layer's backward. The groups, by where echo-tune traces them
(``MODULE_PARTS``; transformer_layer.py, attention.py, multi_latent_attention.py, moe/experts.py):

- ``attn_norm`` / ``mlp_norm``: the layer's input / pre-MLP norm, skipped where the norm is an ``IdentityOp`` (fused
  into TE's LayerNormLinear: the self-attention QKV and the dense MLP's fc1 with Transformer Engine);
- ``qkv_linear``: ``get_query_key_value_tensors`` (QKV, with TE's fused input norm; MLA's down and up projections);
- ``core_attn``, ``attn_proj``: core attention, the output projection;
- ``expert_fc1``: the experts' fc1 (it saves its input, the dispatched tokens); ``moe_act``: the expert activation.

A module whose region selective recompute replays saves only what its checkpoint keeps (its inputs), which is
what is offloaded then. Bytes per layer are what the traced regions save (tensors under 2^20 elements, the norms'
statistics and the like, are counted too: a fraction of a percent of a region's bytes).

Time and memory follow from the copies never being waited for in the forward (``_max_inflight_offloads`` None,
Megatron's default: no main-stream join on the D2H events) and being needed back in the backward:

- forward: no stall; each group's GPU memory is freed only when its copy to the host is done
  (``record_stream`` on the D2H stream). A chunk's micro-batch frees what the host link
  (``cpu_offload.host_link_gbyte_s``: PCIe 5.0 x16, or NVLink-C2C on Grace) copies during that chunk's forward,
  min(offloaded bytes but the last layer's, whose copy starts as the forward ends; link x its forward time)
  (``drained_bytes``; the copies also drain while other passes run, which is not counted: the bytes kept are an
  upper bound where the link is the bottleneck); the rest stays with the micro-batch's activations;
- the stage also keeps back one layer's groups for the whole step (``post_warmup_callback``: the last group of each
  name, so that the first backward does not wait on a reload): ``kept_back_bytes``;
- backward: each layer's groups are reloaded one layer ahead (``pre_reload_last_layer``, ``bulk_reload_group``); the
  reload beyond the layer's backward is exposed (the part ``offload``; sim/features/cpu_offload.py ``offload_costs``).
"""

from __future__ import annotations

from echo_tune.sim.features.cpu_offload import host_link_gbyte_s, offload_costs

MODULES = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")
"""The offload modules modelled (Megatron's fused_group_mlp and gdp_qkv are refused: config/rules/offload_rules.py)."""


def module_parts(model, module: str, moe: bool) -> tuple[str, ...]:
    """The traced regions (or "region/subregion" parts) whose saved tensors ``module``'s offload group holds."""
    te = model.transformer_impl == "transformer_engine"
    mla = model.multi_latent_attention
    if module == "attn_norm":
        return () if te and not mla else ("input_norm",)  # TE LayerNormLinear QKV: input_layernorm is IdentityOp
    if module == "mlp_norm":
        return () if te and not moe else ("mlp_norm",)  # TE LayerNormLinear fc1: pre_mlp_layernorm is IdentityOp
    if module == "qkv_linear":
        return ("qkv", "mla_up_proj") if mla else (("input_norm", "qkv") if te else ("qkv",))
    if module in ("core_attn", "attn_proj"):
        return ("core_attention",) if module == "core_attn" else ("attention_proj",)
    if not moe:
        return ()
    return ("moe/dispatch",) if module == "expert_fc1" else ("moe/expert_act",)


def layer_offloaded_bytes(trace, model, modules, layout, moe: bool) -> float:
    """Bytes one layer's offload groups hold per micro-batch."""
    recomputed = set(layout.recompute_regions) if layout.recompute_granularity == "selective" else set()
    parts = {part for module in modules for part in module_parts(model, module, moe)}
    total = 0.0
    for part in parts:
        if part == "moe/dispatch":  # the dispatched tokens fc1 saves: created by the dispatch, saved by the experts
            total += trace.region_created_bytes.get(part, 0)
            continue
        saved = trace.activation_bytes_by_part.get(part, trace.activation_bytes_by_region.get(part, 0))
        if part in recomputed:  # the checkpoint keeps the region's inputs only
            freed = (trace.region_created_bytes if part in layout.recompute_discarding_regions
                     else trace.region_internal_bytes).get(part, 0)
            saved = max(0, saved - freed)
        total += saved
    return float(total)


def chunk_offloaded_bytes(pieces, model, parallel, layout, dense: int, moe: int) -> tuple[float, float]:
    """(bytes a chunk of ``dense`` + ``moe`` layers offloads per micro-batch, the mean per layer)."""
    if not parallel.fine_grained_activation_offloading or not dense + moe:
        return 0.0, 0.0
    modules = parallel.offload_modules or ()
    total = dense * layer_offloaded_bytes(pieces["layer"], model, modules, layout, False)
    if moe:
        total += moe * layer_offloaded_bytes(pieces["moe_layer"], model, modules, layout, True)
    return total, total / (dense + moe)


def drained_bytes(pieces, model, parallel, layout, dense: int, moe: int, forward_s: float, gpu_name: str) -> float:
    """Activation bytes per micro-batch a chunk no longer keeps on the GPU: its offload groups that the host link
    copies during its forward (``forward_s``), but the last layer's, whose copy starts as the forward ends."""
    total, per_layer = chunk_offloaded_bytes(pieces, model, parallel, layout, dense, moe)
    return min(total - per_layer, host_link_gbyte_s(gpu_name) * 1e9 * forward_s)


def stage_drained_bytes(pieces, model, parallel, layout, mix, forward_s, gpu_name: str) -> list[float]:
    """``drained_bytes`` of each chunk of a stage (``forward_s[chunk]``: its forward pass time)."""
    if not parallel.fine_grained_activation_offloading:
        return [0.0] * len(mix)
    return [drained_bytes(pieces, model, parallel, layout, d, m, f, gpu_name) for (d, m), f in zip(mix, forward_s)]


def kept_back_bytes(pieces, model, parallel, layout, mix) -> float:
    """One layer's groups the stage keeps on the GPU for the whole step (the last group of each name)."""
    if not parallel.fine_grained_activation_offloading:
        return 0.0
    return max((chunk_offloaded_bytes(pieces, model, parallel, layout, d, m)[1] for d, m in mix), default=0.0)


def with_activation_offload(passes, pieces, model, parallel, layout, mix, gpu_name: str):
    """``passes`` ([stage][chunk] (fwd, bwd, recompute)) with each chunk's exposed reloads as ``offload_s`` (the
    forward never waits on its copies out)."""
    if not parallel.fine_grained_activation_offloading:
        return passes
    out = []
    for s, row in enumerate(passes):
        new = []
        for c, (f, b, r) in enumerate(row):
            dense, moe = mix[s][c]
            _, per_layer = chunk_offloaded_bytes(pieces, model, parallel, layout, dense, moe)
            _, ob = offload_costs(f, b, layers=dense + moe, offloaded=dense + moe, layer_bytes=per_layer,
                                  gpu_name=gpu_name)
            new.append((f, b + ob, r))
        out.append(new)
    return out


def activation_offload_notes(pieces, model, parallel, layout, mix, gpu_name: str) -> tuple[str, ...]:
    if not parallel.fine_grained_activation_offloading:
        return ()
    dense, moe = mix[0][0] if mix and mix[0] else (1, 0)
    _, per_layer = chunk_offloaded_bytes(pieces, model, parallel, layout, dense, moe)
    return (f"--fine-grained-activation-offloading ({' '.join(parallel.offload_modules or ())}): "
            f"{per_layer / 2**20:.0f} MiB per layer and micro-batch copied to the host and back at "
            f"{host_link_gbyte_s(gpu_name):.0f} GB/s (datasheet-derived): copies not drained by the end of a chunk's "
            f"forward stay on the GPU; reloads beyond each layer's backward are 'offload'",)
