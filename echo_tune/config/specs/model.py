"""The model spec: one field per Megatron-LM model argument."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from echo_tune.config._checks import require, require_choice, require_positive
from echo_tune.config.specs.layer_fields import LayerFields
from echo_tune.config.specs.linear_attention_fields import LinearAttentionFields
from echo_tune.config.specs.rebuild_fields import RebuildFields
from echo_tune.config.specs.moe_fields import MLAFields, MoEFields, mla_params, moe_layer_pattern, moe_params
from echo_tune.limits import check_number

NORMALIZATIONS = ("LayerNorm", "RMSNorm")
POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "none", "yarn")
# YaRN (Megatron-LM d98e8a64ddf3 core/models/common/embeddings/yarn_rotary_pos_embedding.py
# ``YarnRotaryEmbedding(RotaryEmbedding)``) is RoPE with rescaled inverse frequencies, computed once per step
# into the same [s, 1, 1, d] table, and a concentration factor on cos/sin (rope_utils.py ``mscale``): the same
# rotary kernels on q and k, so echo-tune costs it as rope (``ModelSpec.rotary``). At Megatron's defaults the
# factor is 1 (training/argument_utils.py: --rotary-scaling-factor 1), but Megatron-LM's arguments.py turns the
# RoPE fusion off for any type but rope (``if args.position_embedding_type != 'rope': args.apply_rope_fusion =
# False``), and with a scaling factor above 1 rope_utils.py runs the unfused RoPE in Megatron-Core too: YaRN is
# costed with the unfused kernels (``ModelSpec.rope_fused``).
# Megatron-LM d98e8a64ddf3 core/transformer/enums.py AttnBackend; TransformerConfig.attention_backend
# defaults to auto (Transformer Engine picks flash or cuDNN fused attention, both flash-style kernels).
ATTENTION_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
FLASH_STYLE_BACKENDS = ("auto", "flash", "fused")


@dataclass(frozen=True, kw_only=True)
class ModelSpec(MoEFields, MLAFields, LayerFields, LinearAttentionFields, RebuildFields):
    """A decoder-only transformer, described with Megatron-LM's argument names.

    MoE and MLA fields (``num_experts``, ``moe_*``, ``multi_latent_attention``, ...) come from
    ``moe_fields.py``; attention variants and kernel fusions (``window_size``, ``softmax_type``, ...)
    from ``layer_fields.py``; the gated delta net's (``experimental_attention_variant``, ``linear_*``) from
    ``linear_attention_fields.py``; settings a launch line needs to rebuild the model (``rotary_base``, ...) from
    ``rebuild_fields.py``.

    Optional fields left as ``None`` take Megatron's defaults (see the properties below).
    """

    name: str = "custom"
    """Preset or file name, for reports only."""

    num_layers: int
    """``--num-layers``: number of transformer layers."""

    hidden_size: int
    """``--hidden-size``: transformer hidden size h."""

    num_attention_heads: int
    """``--num-attention-heads``: number of query heads a."""

    num_query_groups: int | None = None
    """``--num-query-groups``: key/value heads for grouped-query attention; None means a (MHA)."""

    ffn_hidden_size: int | None = None
    """``--ffn-hidden-size``: MLP inner size; None means 4h (Megatron's default)."""

    kv_channels: int | None = None
    """``--kv-channels``: size of one attention head; None means h / a."""

    seq_length: int
    """``--seq-length``: tokens per sample s."""

    vocab_size: int
    """Tokenizer vocabulary size before padding (Megatron pads it, see ``padded_vocab_size``)."""

    make_vocab_size_divisible_by: int = 128
    """``--make-vocab-size-divisible-by``: the padded vocabulary is a multiple of this times TP."""

    swiglu: bool = False
    """``--swiglu``: gated SiLU MLP (two input projections) instead of GeLU."""

    normalization: str = "LayerNorm"
    """``--normalization``: LayerNorm or RMSNorm."""

    untie_embeddings_and_output_weights: bool = False
    """``--untie-embeddings-and-output-weights``: separate input embedding and output layer weights."""

    attention_backend: str = "auto"
    """``--attention-backend``: auto (Megatron's default), flash or fused run a flash-style kernel that keeps
    no s x s score matrix for backward; unfused and local run the softmax path that keeps it."""

    use_flash_attn: bool | None = None
    """``--use-flash-attn``, the legacy spelling: True = flash; False = the unfused attention that
    Megatron ran before it had flash attention (the 2021 runs); None = follow ``attention_backend``."""

    position_embedding_type: str = "learned_absolute"
    """``--position-embedding-type``: learned_absolute, rope, yarn (costed as rope, see
    POSITION_EMBEDDING_TYPES) or none."""

    add_bias_linear: bool = True
    """False is ``--disable-bias-linear``: no biases in the linear layers."""

    hidden_dropout: float = 0.1
    """``--hidden-dropout``: dropout after attention and MLP (0 removes the dropout kernels)."""

    attention_dropout: float = 0.1
    """``--attention-dropout``: dropout on the attention probabilities."""

    mtp_num_layers: int | None = None
    """``--mtp-num-layers``: multi-token-prediction layers after the last layer (on the last stage)."""

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
                      "make_vocab_size_divisible_by"):
            require_positive(field, getattr(self, field))
        for field in ("num_query_groups", "ffn_hidden_size", "kv_channels", "mtp_num_layers"):
            if getattr(self, field) is not None:
                require_positive(field, getattr(self, field))
        for field in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                      "kv_channels", "seq_length", "vocab_size", "mtp_num_layers"):
            if getattr(self, field) is not None:  # echo_tune.limits, whichever way the model was built (flags,
                check_number(field, getattr(self, field))  # a launch line over --model, replace())
        require_choice("normalization", self.normalization, NORMALIZATIONS)
        require_choice("position_embedding_type", self.position_embedding_type, POSITION_EMBEDDING_TYPES)
        require_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        for field in ("hidden_dropout", "attention_dropout"):
            value = getattr(self, field)
            require(0.0 <= value < 1.0, f"`0 <= {field} < 1` must hold, but got ({field}={value})")
        if self.kv_channels is None:
            require(self.hidden_size % self.num_attention_heads == 0,
                    f"`hidden_size % num_attention_heads == 0` must hold when kv_channels is unset, but got "
                    f"(hidden_size={self.hidden_size}, num_attention_heads={self.num_attention_heads}); "
                    f"set kv_channels or change the head count")
        self._check_moe()
        self._check_mla()
        self._check_layer_variants()
        self._check_linear_attention()
        self._check_rebuild()
        groups = self.query_groups
        require(self.num_attention_heads % groups == 0,
                f"`num_attention_heads % num_query_groups == 0` must hold, but got "
                f"(num_attention_heads={self.num_attention_heads}, num_query_groups={groups})")

    # --- derived values (never inputs) ---
    @property
    def rotary(self) -> bool:
        """Whether q and k get rotary embeddings: rope, or yarn (RoPE with rescaled frequencies)."""
        return self.position_embedding_type in ("rope", "yarn")

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def rope_fused(self) -> bool:
        """Whether the fused RoPE kernel runs: ``apply_rope_fusion`` with plain rope only (see the YaRN note
        above POSITION_EMBEDDING_TYPES)."""
        return self.apply_rope_fusion and self.position_embedding_type == "rope"

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def flash_attention(self) -> bool:
        """Whether attention runs a flash-style kernel (see ``attention_backend`` / ``use_flash_attn``).

        Attention sinks (``softmax_type`` off-by-one / learnable) with a sliding window and dropout run
        unfused: TE's FlashAttention refuses sinks and its cuDNN fused attention refuses a window with
        dropout (TransformerEngine d0067d0 dot_product_attention/utils.py, get_attention_backend).
        The local spec (``--transformer-impl local``) always runs Megatron's unfused DotProductAttention."""
        if self.local_spec:
            return False
        if self.softmax_type != "vanilla" and self.window_left is not None and self.attention_dropout > 0:
            return False
        if self.use_flash_attn is not None:
            return self.use_flash_attn
        return self.attention_backend in FLASH_STYLE_BACKENDS

    @property
    def ffn_size(self) -> int:
        """``ffn_hidden_size``, else Megatron's default (training/arguments.py at d98e8a64ddf3): 4h, or
        with SwiGLU 2/3 of 4h rounded down to a multiple of 64 (two input projections, same parameters)."""
        if self.ffn_hidden_size:
            return self.ffn_hidden_size
        return int((4 * self.hidden_size * 2 / 3) / 64) * 64 if self.swiglu else 4 * self.hidden_size

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def moe_pattern(self) -> tuple[int, ...]:
        """Per layer: 1 if its MLP is an MoE layer, 0 if dense (all 0 for a dense model)."""
        if not self.is_moe:
            return (0,) * self.num_layers
        return moe_layer_pattern(self.moe_layer_freq, self.num_layers)

    @property
    def moe_ffn_size(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn_size

    def padded_vocab_size(self, tensor_model_parallel_size: int = 1) -> int:
        """Vocabulary padded as Megatron pads it: to a multiple of make_vocab_size_divisible_by x TP."""
        multiple = self.make_vocab_size_divisible_by * tensor_model_parallel_size
        return -(-self.vocab_size // multiple) * multiple

    def layer_params(self, moe: bool = False, linear: bool = False) -> int:
        """Parameters of one transformer layer (unsharded); ``moe``: the layer whose MLP is the MoE block; ``linear``:
        a gated delta net in place of self-attention (linear_attention_fields.py)."""
        h, d, a, g, f = self.hidden_size, self.head_dim, self.num_attention_heads, self.query_groups, self.ffn_size
        bias = self.add_bias_linear
        qkv_bias = (bias or self.add_qkv_bias) and (a + 2 * g) * d
        qkv = h * (a + 2 * g) * d + qkv_bias + (2 * d if self.qk_layernorm else 0)
        proj = a * d * h + (bias and h)
        if self.multi_latent_attention:
            qkv, proj = mla_params(self), a * self.v_head_dim * h + (bias and h)
        if linear:
            qkv, proj = self.gdn_params(), 0
        fc1_out = 2 * f if self.gated_linear_unit else f
        mlp = h * fc1_out + (bias and fc1_out) + f * h + (bias and h)
        if moe:
            mlp = moe_params(self)
        norms = 2 * h * (2 if self.normalization == "LayerNorm" else 1)
        return qkv + proj + mlp + norms + (0 if linear else self.softmax_offset_params())

    def embedding_params(self, tensor_model_parallel_size: int = 1) -> int:
        v = self.padded_vocab_size(tensor_model_parallel_size) * self.hidden_size
        pos = self.position_table_rows * self.hidden_size if self.position_embedding_type == "learned_absolute" else 0
        return v + pos

    def num_params(self, tensor_model_parallel_size: int = 1) -> int:
        """All parameters, counting a tied output layer once."""
        h = self.hidden_size
        final_norm = h * (2 if self.normalization == "LayerNorm" else 1)
        out = self.padded_vocab_size(tensor_model_parallel_size) * h if self.untie_embeddings_and_output_weights else 0
        layers = sum(self.layer_params(moe=bool(k), linear=bool(la))
                     for k, la in zip(self.moe_pattern, self.linear_attention_pattern))
        mtp = (self.mtp_num_layers or 0) * (self.layer_params(moe=bool(self.moe_pattern[-1])) + 2 * h * h + 2 * h)
        return layers + mtp + self.embedding_params(tensor_model_parallel_size) + final_norm + out

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)
