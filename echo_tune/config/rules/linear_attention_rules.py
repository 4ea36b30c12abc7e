"""Megatron-LM's rules for the gated delta net layers (config/specs/linear_attention_fields.py) under a layout, and what
echo-tune does not model beside them; checked once, in ``check_compatible``."""

from __future__ import annotations

from echo_tune.config._checks import require
from echo_tune.config.rules.schedule_rules import cuda_graph_setting
from echo_tune.config.flags.unmodelled import UnmodelledError


def check_linear_attention_layout(model, parallel) -> None:
    """Megatron's rules for the gated delta net under a layout, and what echo-tune does not model beside it."""
    if not model.linear_attention:
        return
    tp, cp = parallel.tensor_model_parallel_size, parallel.context_parallel_size
    for name in ("linear_num_key_heads", "linear_num_value_heads"):  # transformer_config.py __post_init__
        heads = getattr(model, name)
        require(heads % (tp * cp) == 0, f"`{name} % (tensor_model_parallel_size * context_parallel_size) == 0` must "
                                        f"hold (Megatron-LM transformer_config.py), but got ({name}={heads}, "
                                        f"tensor_model_parallel_size={tp}, context_parallel_size={cp})")
    if parallel.fp8:  # common.py: the in_proj output width aligned for FP8 GEMMs (fp8_utils.get_fp8_align_size)
        align = 32 if parallel.fp8_recipe == "mxfp8" else 16
        width = (2 * model.linear_key_head_dim * model.linear_num_key_heads
                 + 2 * model.linear_value_head_dim * model.linear_num_value_heads + 2 * model.linear_num_value_heads)
        require(width % align == 0, f"`gated delta net in_proj width % {align} == 0` must hold under FP8 (Megatron-LM "
                                    f"gated_delta_net/common.py), but got (in_proj width={width})")
    unmodelled = [what for what, on in (
        ("context parallelism (the gated delta net's own all-to-alls, common.py a2a_cp_to_hp)", cp > 1),
        ("multi-token prediction layers", bool(model.mtp_num_layers)),
        ("Megatron-FSDP / Torch-FSDP2", parallel.use_megatron_fsdp or parallel.use_torch_fsdp2),
        ("the Muon optimizer", parallel.muon),
        ("CUDA graphs", cuda_graph_setting(parallel)[0] != "none"),
        ("--cpu-offloading-num-layers", bool(parallel.cpu_offloading_num_layers)),
        ("--fine-grained-activation-offloading", parallel.fine_grained_activation_offloading),
    ) if on]
    if unmodelled:
        raise UnmodelledError(f"the gated delta net (--experimental-attention-variant {model.experimental_attention_variant}) "
                              f"is not modelled beside {', '.join(unmodelled)}; drop those settings to simulate it")
