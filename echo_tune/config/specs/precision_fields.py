"""The training precision fields of ParallelConfig: --bf16 / --fp16, FP8 and NVFP4 linears (Megatron-LM d98e8a64ddf3).

Mechanics: cost/kernels/fp8.py (GEMM rates, quantisation kernels), sim/memory (saved FP8 copies, parameter buffers);
rules between them and the GPU or the other settings: config/rules/.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config._checks import require, require_choice
from echo_tune.config.specs.cluster import PRECISIONS

# Megatron-LM d98e8a64ddf3 megatron/core/transformer/transformer_config.py (fp8, fp8_recipe).
FP8_FORMATS = (None, "e4m3", "hybrid")
FP8_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
FP4_FORMATS = (None, "e2m1")
FP4_RECIPES = ("nvfp4",)  # Megatron also takes "custom" (a user's quantizer factory): not modelled


@dataclass(frozen=True, kw_only=True)
class PrecisionFields:
    precision: str = "bf16"
    """``--bf16`` / ``--fp16`` (or fp32 when neither is given): the parameter and activation dtype."""

    fp8_format: str | None = None
    """``--fp8-format``: e4m3 or hybrid (e4m3 forward, e5m2 gradients) runs the transformer layers'
    linear GEMMs in FP8 through Transformer Engine; None = off. ``precision`` stays bf16, as Megatron
    is launched with ``--bf16 --fp8-format ...``."""

    fp8_recipe: str = "delayed"
    """``--fp8-recipe``: delayed (amax history), tensorwise (current per-tensor scaling), blockwise
    (1x128 / 128x128 blocks) or mxfp8 (32-element blocks, Blackwell only). Megatron's default: delayed."""

    fp8_param_gather: bool = False
    """``--fp8-param-gather``: keep the linear weights in FP8 and all-gather them in FP8 (distributed
    optimizer)."""

    fp4_format: str | None = None
    """``--fp4-format``: e2m1 runs the transformer layers' linear GEMMs in NVFP4 through Transformer Engine
    (``fp4_recipe``); None = off. Excludes ``fp8_format`` (training/arguments.py); ``precision`` stays bf16."""

    fp4_recipe: str = "nvfp4"
    """``--fp4-recipe``: nvfp4, TE's NVFP4BlockScaling (core/fp4_utils.py): 16-element blocks with E4M3 scales and a
    per-tensor scale, 16x16 blocks for weights, random Hadamard transforms on the wgrad GEMMs' inputs, stochastic
    rounding of gradients (cost/kernels/fp8.py)."""

    reuse_grad_buf_for_mxfp8_param_ag: bool = False
    """``--reuse-grad-buf-for-mxfp8-param-ag``: MXFP8 parameters are all-gathered in bf16 into the (idle) gradient
    buffer and re-quantised into their MXFP8 storage afterwards (param_and_grad_buffer.py ``_post_param_sync``),
    instead of keeping a separate parameter buffer (sim/data_parallel/dp.py)."""

    first_last_layers_bf16: bool = False
    """``--first-last-layers-bf16``: run the first and last transformer layers in bf16 (not with the
    delayed recipe)."""

    num_layers_at_start_in_bf16: int = 1
    """``--num-layers-at-start-in-bf16``: layers kept in bf16 at the start (with first_last_layers_bf16)."""

    num_layers_at_end_in_bf16: int = 1
    """``--num-layers-at-end-in-bf16``: layers kept in bf16 at the end (with first_last_layers_bf16)."""

    def _check_precision(self) -> None:
        require_choice("precision", self.precision, PRECISIONS)
        require_choice("fp8_format", self.fp8_format, FP8_FORMATS)
        require_choice("fp8_recipe", self.fp8_recipe, FP8_RECIPES)
        require_choice("fp4_format", self.fp4_format, FP4_FORMATS)
        require_choice("fp4_recipe", self.fp4_recipe, FP4_RECIPES)
        require(self.fp4_format is None or self.fp8_format is None,
                f"--fp4-format and --fp8-format cannot be used simultaneously (Megatron-LM validate_args), but got "
                f"(fp4_format={self.fp4_format!r}, fp8_format={self.fp8_format!r}); choose one")
        for name in ("num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 0, f"`{name} >= 0` must hold, but got ({name}={value!r})")

    @property
    def fp8(self) -> bool:
        """True when the linear GEMMs run in FP8."""
        return self.fp8_format is not None

    @property
    def quantized_recipe(self) -> str | None:
        """The recipe of the TE linears' low-precision GEMMs: nvfp4, the FP8 recipe, or None (bf16)."""
        if self.fp4_format is not None:
            return self.fp4_recipe
        return self.fp8_recipe if self.fp8 else None
