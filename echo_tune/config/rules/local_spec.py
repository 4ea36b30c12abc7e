"""Rules of Megatron-Core's local layer spec (``--transformer-impl local``), as Megatron asserts them.

NVIDIA/Megatron-LM d98e8a64ddf3: gpt_builders.py ``_get_transformer_layer_spec`` builds
core/models/gpt/gpt_layer_specs.py ``get_gpt_layer_local_spec`` (core/models/backends.py
``LocalSpecProvider``): ColumnParallelLinear / RowParallelLinear, a separate norm module (Apex
``FusedLayerNorm`` for LayerNorm, ``WrappedTorchNorm`` = ``torch.nn.RMSNorm`` for RMSNorm),
``DotProductAttention`` (always unfused: ``--attention-backend`` only sets Transformer Engine's
environment) and SequentialMLP experts (``--moe-grouped-gemm`` is not read by the local provider).
"""

from __future__ import annotations

from echo_tune.config._checks import require
from echo_tune.config.flags.unmodelled import UnmodelledError


def check_local_model(model) -> None:
    """Model-only rules of the local spec (no-op under Transformer Engine)."""
    if model.transformer_impl != "local":
        return
    if model.multi_latent_attention:
        raise UnmodelledError(
            "`--transformer-impl local` with `--multi-latent-attention` is not modelled: `multi_latent_attention` "
            "must be False under the local spec, but got (multi_latent_attention=True); use --transformer-impl "
            "transformer_engine")
    if model.normalization == "RMSNorm":  # core/transformer/torch_norm.py WrappedTorchNorm asserts
        require(model.no_persist_layer_norm,
                "`--no-persist-layer-norm` must be set for RMSNorm under `--transformer-impl local` (WrappedTorchNorm "
                "asserts not persist_layer_norm), but got (no_persist_layer_norm=False); add --no-persist-layer-norm")
        require(not model.apply_layernorm_1p,
                "`apply_layernorm_1p` must be False for RMSNorm under `--transformer-impl local` (WrappedTorchNorm "
                "asserts not layernorm_zero_centered_gamma), but got (apply_layernorm_1p=True); drop it")


def check_local_layout(model, parallel, sequence_parallel: bool) -> None:
    """Rules between the local spec and the layout (no-op under Transformer Engine)."""
    if model.transformer_impl != "local":
        return
    cp = parallel.context_parallel_size
    require(cp == 1, f"`context_parallel_size == 1` must hold under `--transformer-impl local` (DotProductAttention "
                     f"asserts it), but got (context_parallel_size={cp}); use --transformer-impl transformer_engine")
    require(not (model.normalization == "RMSNorm" and sequence_parallel),
            "`sequence_parallel` must be off for RMSNorm under `--transformer-impl local` (WrappedTorchNorm asserts "
            "it), but got (sequence_parallel=True); drop --sequence-parallel or use LayerNorm")
    require(not parallel.delay_wgrad_compute,
            "`delay_wgrad_compute` needs `--transformer-impl transformer_engine` (arguments.py asserts it), but got "
            "(delay_wgrad_compute=True, transformer_impl='local'); drop --delay-wgrad-compute")
    # not asserted by Megatron, but these only act through TE modules: the local layers would silently run
    # bf16 GEMMs without overlap, which is not what the flag asks for
    require(not parallel.fp8, f"`fp8_format` needs Transformer Engine layers (fp8_autocast does not reach the "
                              f"local spec's torch GEMMs), but got (fp8_format={parallel.fp8_format!r}, "
                              f"transformer_impl='local'); drop --fp8-format or use --transformer-impl transformer_engine")
    require(not parallel.tp_comm_overlap,
            "`tp_comm_overlap` needs Transformer Engine layers (its userbuffers overlap only TE's linear layers), but "
            "got (tp_comm_overlap=True, transformer_impl='local'); drop --tp-comm-overlap")
