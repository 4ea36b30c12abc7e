"""The Muon optimizer's settings echo-tune does not model, refused once where a step's specs are built
(``check_compatible``); the optimizer's step is sim/data_parallel/optimizer_muon.py's."""

from __future__ import annotations

from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.errors import ConfigError


def check_muon(model: ModelSpec, parallel: ParallelConfig) -> None:
    """The Muon settings echo-tune does not model, refused by a one-line ConfigError."""
    if not parallel.muon:
        return
    if model.multi_latent_attention:
        raise ConfigError("`--optimizer muon` with multi_latent_attention is not modelled (its projections' "
                          "shapes are not counted); use adam or drop multi_latent_attention")
    if parallel.use_precision_aware_optimizer:
        raise ConfigError("`--optimizer muon` with use_precision_aware_optimizer is not modelled; drop "
                          "--use-precision-aware-optimizer")
    if parallel.num_distributed_optimizer_instances > 1:
        raise ConfigError(f"`--optimizer muon` with num_distributed_optimizer_instances > 1 is not modelled, but "
                          f"got (num_distributed_optimizer_instances={parallel.num_distributed_optimizer_instances})"
                          f"; drop it")
    if parallel.use_megatron_fsdp:
        raise ConfigError("`--optimizer muon` with use_megatron_fsdp is not modelled (Muon's whole-matrix "
                          "Newton-Schulz over FSDP shards); use adam or drop --use-megatron-fsdp")
