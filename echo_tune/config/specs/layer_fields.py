"""Attention / layer variants and kernel-fusion switches of a transformer layer (Megatron argument names).

Mechanics as in NVIDIA/Megatron-LM d98e8a64ddf3 (training/arguments.py, training/argument_utils.py,
core/transformer/transformer_config.py, core/transformer/utils.py) and Transformer Engine's attention
backend selection (NVIDIA/TransformerEngine d0067d0, pytorch/attention/dot_product_attention/utils.py
``get_attention_backend``). Where they are costed: workload/attention/window_attention.py (sliding window),
workload/mlp/activations.py (MLP activations, unfused bias/activation kernels), workload/attention/rotary.py (RoPE),
workload/ends/loss.py (cross-entropy fusion).
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config._checks import require, require_choice
from echo_tune.config.specs.layer_pattern import skip_freq_pattern
from echo_tune.config.rules.local_spec import check_local_model
from echo_tune.errors import ConfigError

SOFTMAX_TYPES = ("vanilla", "off-by-one", "learnable")
CROSS_ENTROPY_FUSION_IMPLS = ("native", "te")
TRANSFORMER_IMPLS = ("transformer_engine", "local")


def parse_window_size(value) -> tuple[int, int] | None:
    """``--window-size`` as Megatron's ``tuple_type`` reads it ("left,right", or "(left,right)").

    A single number ``w`` (as runs_bridge.csv writes GPT-OSS's ``(128, 0)``, commas being its column
    separator) means (w, 0): under the causal mask TE sets the right window to 0 anyway
    (``check_set_window_size``). (-1, -1) / (-1, 0) mean no window (TE's "infinite" left window)."""
    if value is None or isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, int) for v in value):
        return value
    if isinstance(value, bool):
        raise ConfigError(f"`window_size` must be 'left,right' or one integer, but got (window_size={value!r})")
    if isinstance(value, int):
        return (value, 0)
    parts = list(value) if isinstance(value, (list, tuple)) else str(value).strip().strip("()[]").split(",")
    try:
        numbers = tuple(int(str(p).strip()) for p in parts if str(p).strip() != "")
    except ValueError:
        numbers = ()
    if len(numbers) not in (1, 2):
        raise ConfigError(f"`window_size` must be 'left,right' or one integer (the left window), but got "
                          f"(window_size={value!r})")
    return numbers if len(numbers) == 2 else (numbers[0], 0)


@dataclass(frozen=True, kw_only=True)
class LayerFields:
    """Attention variants, activation choices and kernel fusions (all defaults: Megatron's defaults)."""

    window_size: tuple[int, int] | None = None
    """``--window-size``: sliding-window attention, (left, right) tokens; each query attends to the
    ``left`` previous keys and itself (right is 0 under the causal mask). None: full causal attention."""

    window_attn_skip_freq: int | str | None = None
    """``--window-attn-skip-freq``: N = every N-th layer (1-based layer number divisible by N) keeps full
    attention, the others the window; or a 0/1 list expression, 1 = window (core/transformer/utils.py
    ``is_layer_window_attention``). None: every layer has the window."""

    softmax_type: str = "vanilla"
    """``--softmax-type``: vanilla, off-by-one or learnable (attention sinks: one extra logit per head,
    a learned parameter per head for learnable). TE runs them in cuDNN fused attention (FlashAttention
    refuses them), or unfused when fused attention is disabled (deterministic mode, dropout with a window)."""

    rotary_percent: float = 1.0
    """``--rotary-percent``: fraction of each head's dimension RoPE rotates (the rest passes through)."""

    rotary_interleaved: bool = False
    """``--rotary-interleaved``: rotate (even, odd) pairs instead of the two halves; same bytes and
    FLOPs, modelled at no extra cost (it rules out the fused RoPE kernel only for MLA)."""

    apply_layernorm_1p: bool = False
    """``--apply-layernorm-1p`` (TransformerConfig.layernorm_zero_centered_gamma): the norm multiplies by
    (1 + gamma); TE's fused norm kernel takes it as a flag: same kernel, no extra cost."""

    squared_relu: bool = False
    """``--squared-relu``: relu(x)^2 activation (non-gated, ``activations.squared_relu``) instead of GeLU."""

    apply_rope_fusion: bool = True
    """False is ``--no-rope-fusion``: RoPE as separate elementwise kernels instead of TE's fused one."""

    bias_gelu_fusion: bool = True
    """False is ``--no-bias-gelu-fusion``: the fc1 bias add and the GeLU run as two kernels (fused: one,
    ``echo_tune::bias_gelu``)."""

    bias_swiglu_fusion: bool = True
    """False is ``--no-bias-swiglu-fusion``: SwiGLU as separate silu and multiply kernels (and a bias add)."""

    bias_dropout_fusion: bool = True
    """False is ``--no-bias-dropout-fusion``: bias add, dropout and residual add as separate kernels
    (fused: one, ``echo_tune::bias_dropout_add``; without bias and dropout one residual add either way)."""

    no_persist_layer_norm: bool = False
    """``--no-persist-layer-norm``: only the local spec's norms read it: Apex FusedLayerNorm picks another
    one-kernel variant (core/fusions/fused_layer_norm.py: no cost change), torch RMSNorm requires it
    (config/rules/local_spec.py); under Transformer Engine it changes nothing."""

    cross_entropy_loss_fusion: bool = False
    """``--cross-entropy-loss-fusion``: the vocabulary-parallel cross-entropy as fused kernels
    (workload/ends/loss.py) instead of Megatron's unfused torch ops."""

    cross_entropy_fusion_impl: str = "native"
    """``--cross-entropy-fusion-impl``: native (Megatron's jit-fused kernels) or te (TE's Triton
    ``parallel_cross_entropy``; Megatron d98e8a64 refuses it in validate_args, recipes of NeMo 25.11 ran it)."""

    transformer_impl: str = "transformer_engine"
    """``--transformer-impl``: transformer_engine (TE layers) or local (Megatron-Core's own layers,
    ``get_gpt_layer_local_spec``: unfused attention always, Apex / torch norms, SequentialMLP experts;
    config/rules/local_spec.py, workload/attention/scale_mask_softmax.py)."""

    masked_softmax_fusion: bool = True
    """False is ``--no-masked-softmax-fusion``: the local spec's FusedScaleMaskSoftmax runs torch ops
    (cast, mask, softmax, cast) instead of the fused causal softmax kernel (TE's attention ignores it)."""

    attention_softmax_in_fp32: bool = False
    """``--attention-softmax-in-fp32``: the local spec's torch softmax path runs (and keeps) fp32 scores."""

    apply_query_key_layer_scaling: bool = False
    """``--apply-query-key-layer-scaling``: scale Q K^T by 1 / layer number; turns on
    ``attention_softmax_in_fp32`` (arguments.py validate_args) and adds a scale kernel on the torch path."""

    use_transformer_engine_op_fuser: bool = False
    """``--use-transformer-engine-op-fuser``: Transformer Engine's operation-based API (te.pytorch.ops). The dense
    MLP becomes TEFusedMLP (norm, fc1, bias, activation, fc2: the kernels TE's modules run already, modelled
    unchanged); the MoE experts with ``moe_grouped_gemm`` become the fused grouped MLP over a GroupedTensor
    (moe/experts.py, TE >= 2.14 ``ops.GroupedLinear``): each grouped GEMM is one kernel over all local experts and
    each quantisation one kernel for the group, not one per expert (cost/kernels/moe_grouped_gemm.py)."""

    attention_output_gate: bool = False
    """``--attention-output-gate``: the QKV projection also outputs a gate of the query's size, and the core
    attention output is multiplied by its sigmoid before the output projection (workload/attention/output_gate.py)."""

    def _check_layer_variants(self) -> None:
        object.__setattr__(self, "window_size", parse_window_size(self.window_size))
        require_choice("softmax_type", self.softmax_type, SOFTMAX_TYPES)
        require_choice("cross_entropy_fusion_impl", self.cross_entropy_fusion_impl, CROSS_ENTROPY_FUSION_IMPLS)
        require_choice("transformer_impl", self.transformer_impl, TRANSFORMER_IMPLS)
        check_local_model(self)
        if self.use_transformer_engine_op_fuser:
            require(self.transformer_impl == "transformer_engine",
                    "`use_transformer_engine_op_fuser` needs Transformer Engine, but got (transformer_impl='local'); "
                    "drop --use-transformer-engine-op-fuser")
        require(0.0 < self.rotary_percent <= 1.0,
                f"`0 < rotary_percent <= 1` must hold, but got (rotary_percent={self.rotary_percent})")
        if self.window_size is not None:
            left, right = self.window_size
            require(left >= -1 and right >= -1, f"`window_size` entries must be >= -1, but got "
                                                f"(window_size={self.window_size})")
        if self.window_attn_skip_freq is not None:
            self.window_pattern  # noqa: B018  (validates the pattern)
        require(not (self.attention_output_gate and self.multi_latent_attention),  # type: ignore[attr-defined]
                "`attention_output_gate` is not supported with `multi_latent_attention` (transformer_config.py "
                "MLATransformerConfig: \"Output gate is not supported for MLA yet.\"), but got both; drop one")
        require(not (self.squared_relu and self.swiglu),  # type: ignore[attr-defined]
                "`squared_relu` and `swiglu` cannot both be set (argument_utils.py asserts not args.swiglu), "
                "but got (squared_relu=True, swiglu=True); pick one activation")

    @property
    def local_spec(self) -> bool:
        """Whether the layers are Megatron-Core's local spec (``--transformer-impl local``)."""
        return self.transformer_impl == "local"

    @property
    def softmax_in_fp32(self) -> bool:
        """The local softmax's torch path in fp32: ``--attention-softmax-in-fp32``, or forced by
        ``--apply-query-key-layer-scaling`` (arguments.py validate_args, transformer_config.py)."""
        return self.attention_softmax_in_fp32 or self.apply_query_key_layer_scaling

    @property
    def window_left(self) -> int | None:
        """Keys before each query its window reaches, or None without a window (left -1 = unbounded)."""
        if self.window_size is None or self.window_size[0] < 0:
            return None
        return self.window_size[0]

    @property
    def window_pattern(self) -> tuple[int, ...]:
        """Per layer (0-based): 1 if it runs the sliding window, 0 for full attention
        (``is_layer_window_attention`` with 1-based layer numbers)."""
        n = self.num_layers  # type: ignore[attr-defined]
        if self.window_left is None:
            return (0,) * n
        freq = self.window_attn_skip_freq
        if freq is None:
            return (1,) * n
        return skip_freq_pattern("window_attn_skip_freq", freq, n, "window")

    @property
    def windowed_attention(self) -> bool:
        """Whether any layer runs sliding-window attention shorter than the sequence."""
        return self.window_left is not None and self.window_left + 1 < self.seq_length and any(  # type: ignore
            self.window_pattern)

    def softmax_offset_params(self) -> int:
        """Learnable sink logits of one layer: one per attention head (dot_product_attention.py)."""
        return self.num_attention_heads if self.softmax_type == "learnable" else 0  # type: ignore[attr-defined]
