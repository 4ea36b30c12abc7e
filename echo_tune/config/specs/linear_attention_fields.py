"""Hybrid linear attention (Qwen3-Next style): ``--experimental-attention-variant gated_delta_net`` and its layer pattern.

Megatron-LM d98e8a64ddf3: core/transformer/transformer_config.py (the fields, their defaults and checks),
core/models/gpt/experimental_attention_variant_module_specs.py (``get_linear_attention_pattern``: the layers that run
the gated delta net instead of self-attention; ``_DEPRECATED_ATTENTION_VARIANT_ALIASES``: gated_delta_net -> gdn),
core/ssm/gated_delta_net/ (the layer; workload/attention/gated_delta_net.py traces it).
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config._checks import require, require_positive
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.config.specs.layer_pattern import skip_freq_pattern

ATTENTION_VARIANT_ALIASES = {"gated_delta_net": "gdn"}
"""Deprecated spellings Megatron maps to their canonical name (experimental_attention_variant_module_specs.py)."""
NOT_MODELLED_VARIANTS = {
    "gdn2": "GatedDeltaNet2 (gdn2.py: a different in_proj and kernel)",
    "dsa": "DeepSeek sparse attention (dsa.py: an indexer and top-k sparse MLA)",
}


@dataclass(frozen=True, kw_only=True)
class LinearAttentionFields:
    """The gated delta net's settings (TransformerConfig defaults)."""
    experimental_attention_variant: str | None = None
    """``--experimental-attention-variant``: gdn (or its old spelling gated_delta_net): the layers
    ``linear_attention_freq`` selects run a gated delta net (Yang et al., arXiv 2412.06464) instead of self-attention.
    gdn2 and dsa are refused by name."""
    linear_attention_freq: int | str | None = None
    """``--linear-attention-freq``: N = every N-th layer (1-based) keeps self-attention, the others the gated delta
    net; or a 0/1 list expression of one entry per layer, 1 = gated delta net."""
    linear_conv_kernel_dim: int = 4
    """``--linear-conv-kernel-dim``: the causal depthwise convolution's width over q, k and v."""
    linear_key_head_dim: int = 128
    """``--linear-key-head-dim``: query and key head size."""
    linear_value_head_dim: int = 128
    """``--linear-value-head-dim``: value (and output gate) head size."""
    linear_num_key_heads: int = 16
    """``--linear-num-key-heads``: query and key heads."""
    linear_num_value_heads: int = 32
    """``--linear-num-value-heads``: value heads (a multiple of the key heads)."""
    def _check_linear_attention(self) -> None:
        variant = self.experimental_attention_variant
        if variant is None:
            require(self.linear_attention_freq is None,
                    "`linear_attention_freq` applies with `experimental_attention_variant gdn`, but got "
                    f"(linear_attention_freq={self.linear_attention_freq!r}, experimental_attention_variant=None)")
            return
        if variant in NOT_MODELLED_VARIANTS:
            raise UnmodelledError(f"`--experimental-attention-variant {variant}` ({NOT_MODELLED_VARIANTS[variant]}) "
                                  f"is not modelled; echo-tune models gdn (the gated delta net) only")
        require(self.linear_variant == "gdn", f"`experimental_attention_variant` must be one of gdn, gated_delta_net, "
                                              f"gdn2, dsa (Megatron-LM), but got (experimental_attention_variant="
                                              f"{variant!r})")
        require(self.linear_attention_freq is not None, "linear_attention_freq must be set for linear gdn "
                                                        "(Megatron-LM transformer_config.py); add --linear-attention-freq")
        for name in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                     "linear_num_value_heads"):
            require_positive(name, getattr(self, name))
        require(self.linear_num_value_heads % self.linear_num_key_heads == 0,
                f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of linear_num_key_heads "
                f"({self.linear_num_key_heads}) (Megatron-LM transformer_config.py)")
        self.linear_attention_pattern  # noqa: B018  (validates the pattern)

    @property
    def linear_variant(self) -> str | None:
        """The canonical variant name (gated_delta_net -> gdn), or None."""
        v = self.experimental_attention_variant
        return ATTENTION_VARIANT_ALIASES.get(v, v) if v is not None else None

    @property
    def linear_attention_pattern(self) -> tuple[int, ...]:
        """Per layer (0-based): 1 for a gated delta net, 0 for self-attention (``get_linear_attention_pattern``)."""
        n = self.num_layers  # type: ignore[attr-defined]
        if self.linear_variant is None:
            return (0,) * n
        return skip_freq_pattern("linear_attention_freq", self.linear_attention_freq, n, "gated delta net")

    @property
    def linear_attention(self) -> bool:
        """Whether any layer runs the gated delta net."""
        return any(self.linear_attention_pattern)

    def gdn_params(self) -> int:
        """Parameters of one gated delta net block in place of self-attention's QKV and output projections, unsharded
        (GatedDeltaNet.__init__, no biases): in_proj (h -> 2 qk + 2 v + 2 value heads; its fused input norm is the
        layer's input norm, counted with the layer's norms), the depthwise conv1d over q, k, v, dt_bias and A_log (one
        per value head), the output norm over a value head, and out_proj (v -> h)."""
        h = self.hidden_size  # type: ignore[attr-defined]
        qk = self.linear_key_head_dim * self.linear_num_key_heads
        v = self.linear_value_head_dim * self.linear_num_value_heads
        in_proj = h * (2 * qk + 2 * v + 2 * self.linear_num_value_heads)
        conv = (2 * qk + v) * self.linear_conv_kernel_dim
        norm_weights = 1 if self.normalization == "RMSNorm" else 2  # type: ignore[attr-defined]
        return in_proj + conv + 2 * self.linear_num_value_heads + norm_weights * self.linear_value_head_dim + v * h
