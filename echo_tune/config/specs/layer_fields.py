"""Attention / layer variants and kernel-fusion switches of a transformer layer (Megatron argument names).

Mechanics as in NVIDIA/Megatron-LM d98e8a64ddf3 (training/arguments.py, training/argument_utils.py,
core/transformer/transformer_config.py, core/transformer/utils.py) and Transformer Engine's attention
backend selection (NVIDIA/TransformerEngine d0067d0, pytorch/attention/dot_product_attention/utils.py
``get_attention_backend``). Where they are costed: workload/attention/window_attention.py (sliding window),
workload/mlp/activations.py (MLP activations, unfused bias/activation kernels), workload/attention/rotary.py (RoPE),
workload/ends/loss.py (cross-entropy fusion).
"""

from __future__ import annotations

import math
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

    quick_geglu: bool = False
    """``--quick-geglu``: gated quick-GeLU MLP, quick_gelu(x1) * (x2 + glu_linear_offset) with quick_gelu(x) =
    x * sigmoid(1.702 x) (core/fusions/fused_bias_geglu.py; two input projections, as SwiGLU). Fused under
    ``bias_gelu_fusion`` (Megatron's bias_activation_fusion for a non-SwiGLU model), which only the experts'
    probability-weighted kernel offers (workload/mlp/activations.py)."""

    activation_func_clamp_value: float | None = None
    """TransformerConfig ``activation_func_clamp_value`` (no Megatron-LM flag at d98e8a64ddf3; model providers set
    it, e.g. Megatron-Bridge's GPTOSSProvider 7.0): the gated activation clamps its gate half to <= v and its
    linear half to [-v, v]. Quick-GeGLU clamps in separate kernels before its fused kernel; SwiGLU inside it."""

    glu_linear_offset: float = 0.0
    """TransformerConfig ``glu_linear_offset`` (no Megatron-LM flag at d98e8a64ddf3; GPTOSSProvider 1.0): the gated
    activation multiplies by (x2 + offset). Inside the fused quick-GeGLU kernel; one more kernel unfused."""

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
        self._check_gated_activation()

    def _check_gated_activation(self) -> None:
        """TransformerConfig.__post_init__ / argument_utils.py at d98e8a64ddf3 on quick-GeGLU, the clamp and the
        linear offset."""
        swiglu = self.swiglu  # type: ignore[attr-defined]
        require(not (self.quick_geglu and (swiglu or self.squared_relu)),
                f"`quick_geglu` excludes `swiglu` and `squared_relu` (argument_utils.py asserts not args.swiglu), but "
                f"got (quick_geglu=True, swiglu={swiglu}, squared_relu={self.squared_relu}); pick one activation")
        clamp, offset = self.activation_func_clamp_value, self.glu_linear_offset
        if clamp is not None:
            require(isinstance(clamp, (int, float)) and math.isfinite(clamp) and clamp > 0,
                    f"`activation_func_clamp_value > 0` (finite) must hold, but got (activation_func_clamp_value="
                    f"{clamp!r}); give a positive limit or leave it unset")
            require(self.quick_geglu or swiglu,
                    f"`activation_func_clamp_value` needs a gated activation (quick_geglu or swiglu), but got "
                    f"(activation_func_clamp_value={clamp}, quick_geglu=False, swiglu=False); add --quick-geglu or "
                    f"--swiglu, or leave the clamp unset")
            require(not swiglu or (self.num_experts is not None and offset == 0.0),  # type: ignore[attr-defined]
                    f"a clamped SwiGLU needs MoE and `glu_linear_offset == 0` (transformer_config.py), but got "
                    f"(num_experts={self.num_experts}, glu_linear_offset={offset}); use --quick-geglu or drop the clamp")  # type: ignore[attr-defined]
        dense_mlp = not all(self.moe_pattern) or self.moe_shared_expert_intermediate_size  # type: ignore[attr-defined]
        require(not (self.quick_geglu and self.bias_gelu_fusion and dense_mlp),
                "a dense MLP (or shared expert) cannot fuse quick-GeGLU: Megatron's MLP fuses only GeLU and SwiGLU "
                "without per-token weights (mlp.py: 'Only support fusion of gelu and swiglu'), but got (quick_geglu="
                "True, bias_gelu_fusion=True) with dense MLPs; add --no-bias-gelu-fusion or make every layer MoE")
        require(isinstance(offset, (int, float)) and math.isfinite(offset),
                f"`glu_linear_offset` must be a finite number, but got (glu_linear_offset={offset!r})")
        if offset != 0.0:
            require(self.quick_geglu or (swiglu and not self.bias_swiglu_fusion),
                    f"`glu_linear_offset` needs quick-GeGLU, or an unfused SwiGLU (transformer_config.py: a fused "
                    f"activation with an offset must be quick_gelu), but got (glu_linear_offset={offset}, "
                    f"quick_geglu={self.quick_geglu}, swiglu={swiglu}); add --quick-geglu or set the offset to 0")

    @property
    def gated_linear_unit(self) -> bool:
        """Whether the MLP's fc1 writes two halves (gate and linear): SwiGLU or quick-GeGLU."""
        return self.swiglu or self.quick_geglu  # type: ignore[attr-defined]

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
