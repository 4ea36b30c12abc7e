"""Megatron-LM's settings required for ``--deterministic-mode`` (megatron/training/determinism.py at d98e8a64ddf3),
checked once where a step's specs are built (``check_compatible``); what the mode changes in a step is
sim/features/determinism.py's."""

from __future__ import annotations

from echo_tune.errors import ConfigError


def check_deterministic(model, parallel) -> None:
    """Megatron's ``ARG_VALUES_REQUIRED_FOR_DETERMINISM``."""
    if not parallel.deterministic_mode:
        return
    for name, value in (("cross_entropy_loss_fusion", model.cross_entropy_loss_fusion),
                        ("tp_comm_overlap", parallel.tp_comm_overlap)):
        if value:
            raise ConfigError(f"`{name}` must be off with deterministic_mode (megatron/training/determinism.py), "
                              f"but got ({name}=True); drop --{name.replace('_', '-')} or --deterministic-mode")
