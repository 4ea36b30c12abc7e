"""Specs (model, GPU, cluster, parallel layout), presets and the cross-object rules."""

from echo_tune.config.specs.cluster import ClusterSpec, GPUSpec
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.specs.layout import GroupPlacement, Layout
from echo_tune.config.load.loading import load_cluster, load_gpu, load_model, preset_names
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig

__all__ = ["ClusterSpec", "GPUSpec", "GroupPlacement", "Layout", "ModelSpec", "ParallelConfig",
           "check_compatible", "load_cluster", "load_gpu", "load_model", "preset_names"]
