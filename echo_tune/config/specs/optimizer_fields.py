"""The optimizer's fields of ParallelConfig: Adam (the default) or Muon (Megatron-LM d98e8a64ddf3).

Megatron's ``--optimizer`` choices (training/arguments.py) are adam, sgd, muon, dist_muon, lion, soap and
adaptive_muon; echo-tune models adam, muon and dist_muon (sim/data_parallel/optimizer_muon.py). ``dist_muon`` is Megatron's
deprecated spelling of ``--optimizer muon --use-distributed-optimizer`` and is rewritten to it, as
``validate_args`` does ("optimizer='dist_muon' is deprecated. Use --optimizer muon --use-distributed-optimizer
instead."). With Muon, ``--use-distributed-optimizer`` means Megatron's *layer-wise* distributed optimizer
(core/optimizer/layer_wise_optimizer.py): whole weight matrices are owned by one data-parallel rank each.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config._checks import require, require_choice
from echo_tune.errors import ConfigError

OPTIMIZERS = ("adam", "muon", "dist_muon")
"""Modelled values of ``--optimizer``."""
UNMODELLED_OPTIMIZERS = ("sgd", "lion", "soap", "adaptive_muon")
MUON_TP_MODES = ("blockwise", "duplicated")
"""Modelled values of ``--muon-tp-mode`` (``distributed``, a Newton-Schulz sharded over TP with a Gram-matrix
all-reduce per iteration, is not)."""
MUON_SCALAR_OPTIMIZERS = ("adam", "lion")


@dataclass(frozen=True, kw_only=True)
class OptimizerFields:
    optimizer: str = "adam"
    """``--optimizer``: adam (Megatron's default), or muon (Newton-Schulz-orthogonalized momentum on the 2-D
    weight matrices, Adam on the rest; sim/data_parallel/optimizer_muon.py). dist_muon is read as muon with
    use_distributed_optimizer."""

    muon_num_ns_steps: int = 5
    """``--muon-num-ns-steps``: Newton-Schulz iterations per weight matrix and step (default 5)."""

    muon_tp_mode: str = "duplicated"
    """``--muon-tp-mode``: duplicated (all-gather a TP-sharded momentum over TP, orthogonalize the whole matrix on
    every TP rank; the default) or blockwise (orthogonalize each rank's shard alone, no communication)."""

    muon_split_qkv: bool = True
    """False is ``--muon-no-split-qkv``: by default the fused QKV weight is orthogonalized as separate Q, K and V
    matrices (core/optimizer/emerging_optimizers.py ``TensorParallelMuon.orthogonalize``)."""

    muon_scalar_optimizer: str = "adam"
    """``--muon-scalar-optimizer``: the optimizer of the parameters Muon leaves out (embeddings, output layer,
    norms, biases): adam (two fp32 states) or lion (one)."""

    use_layer_wise_param_layout: bool = True
    """False is ``--no-use-layer-wise-param-layout``: Muon's layer-wise distributed optimizer falls back to its
    legacy path, where DDP all-reduces the gradients (instead of reduce-scattering into a shard-aligned buffer)
    before the updated parameters are all-gathered (training/models/dist_utils.py)."""

    def _check_optimizer(self) -> None:
        if self.optimizer in UNMODELLED_OPTIMIZERS:
            raise ConfigError(f"`--optimizer {self.optimizer}` is not modelled (echo-tune models "
                              f"{', '.join(OPTIMIZERS)}); use one of them")
        require_choice("optimizer", self.optimizer, OPTIMIZERS)
        if self.optimizer == "dist_muon":  # arguments.py validate_args: the deprecated spelling
            object.__setattr__(self, "optimizer", "muon")
            object.__setattr__(self, "use_distributed_optimizer", True)
        require(isinstance(self.muon_num_ns_steps, int) and self.muon_num_ns_steps >= 1,
                f"`muon_num_ns_steps >= 1` must hold (emerging_optimizers.py TensorParallelMuon), but got "
                f"(muon_num_ns_steps={self.muon_num_ns_steps!r})")
        if self.muon_tp_mode == "distributed":
            raise ConfigError("`--muon-tp-mode distributed` is not modelled (a Gram-matrix all-reduce per "
                              "Newton-Schulz step); use duplicated or blockwise")
        require_choice("muon_tp_mode", self.muon_tp_mode, MUON_TP_MODES)
        require_choice("muon_scalar_optimizer", self.muon_scalar_optimizer, MUON_SCALAR_OPTIMIZERS)

    @property
    def muon(self) -> bool:
        return self.optimizer == "muon"
