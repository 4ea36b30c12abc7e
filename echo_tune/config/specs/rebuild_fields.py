"""Model fields that do not change a step's time or memory but that a launch line needs to rebuild the model.

``megatron_args.txt`` must give Megatron-LM the model that was read (issue 20 item 3): Qwen2.5 needs
``--add-qkv-bias --rotary-base 1000000 --norm-epsilon 1e-06``, Llama 3.1 ``--use-rope-scaling``. These
fields carry such settings from a config.json, a YAML file or a launch line to the written flags; the
simulator reads only ``add_qkv_bias`` (the q/k/v biases count as parameters; their add runs in the QKV
GEMM's epilogue and is not timed separately) and ``max_position_embeddings`` (the learned position table's
rows). Defaults are Megatron-LM's (training/arguments.py and core/transformer/transformer_config.py at
NVIDIA/Megatron-LM d98e8a64ddf3), so a model that sets none of them writes none of the flags.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config._checks import require


@dataclass(frozen=True, kw_only=True)
class RebuildFields:
    add_qkv_bias: bool = False
    """``--add-qkv-bias``: biases on the query, key and value projections only (Qwen2)."""

    rotary_base: int = 10000
    """``--rotary-base``: RoPE's base period (a config.json's ``rope_theta``)."""

    norm_epsilon: float = 1e-5
    """``--norm-epsilon``: epsilon of LayerNorm / RMSNorm (``rms_norm_eps``, ``layer_norm_epsilon``)."""

    use_rope_scaling: bool = False
    """``--use-rope-scaling``: Llama 3.1's RoPE frequency scaling (``rope_scaling.rope_type: llama3``)."""

    rope_scaling_factor: float = 8.0
    """``--rope-scaling-factor``: its factor (read with ``--use-rope-scaling``)."""

    rotary_scaling_factor: float = 1.0
    """``--rotary-scaling-factor``: YaRN's factor for multi-latent attention (DeepSeek's ``rope_scaling.factor``)."""

    mscale: float = 1.0
    """``--mscale``: YaRN's attention concentration for MLA."""

    mscale_all_dim: float = 0.0
    """``--mscale-all-dim``: YaRN's mscale over all dimensions for MLA."""

    max_position_embeddings: int | None = None
    """``--max-position-embeddings``: rows of the position table; None means ``seq_length``. Megatron-LM
    asserts ``max_position_embeddings >= seq_length`` (validate_args)."""

    def _check_rebuild(self) -> None:
        seq = self.seq_length  # type: ignore[attr-defined]
        require(self.rotary_base > 0 and self.norm_epsilon > 0,
                f"`rotary_base > 0` and `norm_epsilon > 0` must hold, but got (rotary_base={self.rotary_base}, "
                f"norm_epsilon={self.norm_epsilon})")
        if self.max_position_embeddings is not None:
            require(self.max_position_embeddings >= seq,
                    f"`max_position_embeddings >= seq_length` must hold (Megatron-LM asserts it in validate_args), "
                    f"but got (max_position_embeddings={self.max_position_embeddings}, seq_length={seq}); raise "
                    f"max_position_embeddings or leave it out")

    @property
    def position_table_rows(self) -> int:
        return self.max_position_embeddings or self.seq_length  # type: ignore[attr-defined]
