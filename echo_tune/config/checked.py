"""Where a step's specs are checked, once: Megatron-FSDP's rules (and the settings they imply), then every
cross-object rule (``check_compatible``); the simulator receives the checked settings and their ``Layout``.
"""

from __future__ import annotations

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.rules.fsdp_rules import check_fsdp
from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig


def checked_step(model: ModelSpec, cluster: ClusterSpec, num_gpus: int, parallel: ParallelConfig,
                 layout: Layout | None = None) -> tuple[ParallelConfig, Layout]:
    """(the settings in effect, their Layout), or a one-line ConfigError for the rule they break. ``layout``:
    what ``check_compatible`` returned for these very objects (a search's candidates carry it), reused where
    Megatron-FSDP leaves the settings as given (the settings it changes are checked again)."""
    checked = check_fsdp(parallel)  # Megatron-FSDP's rules and the settings it implies (sim/data_parallel/fsdp.py)
    if layout is None or checked is not parallel:
        layout = check_compatible(model, cluster, num_gpus, checked)
    return checked, layout
