"""echo-tune: find the fastest Megatron-LM layout for a model and cluster, before booking GPUs.

The public API, for notebooks and scripts::

    import echo_tune as et
    model = et.load_model("gpt3-175b")
    cluster = et.load_cluster("a100-80gb")
    layout = et.ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=16,
                               global_batch_size=1536, recompute_granularity="full")
    report = et.simulate(model, cluster, 1024, layout)
    report.step_time_s, report.breakdown_s
"""

import importlib

from echo_tune.config import (ClusterSpec, GPUSpec, Layout, ModelSpec, ParallelConfig, check_compatible,
                              load_cluster, load_gpu, load_model, preset_names)
from echo_tune.cost.profile import ClusterProfile, default_profile, load_profile, profile_for, save_profile
from echo_tune.errors import CalibrationError, ConfigError, EchoTuneError, InfeasibleConfigError

# The simulator imports torch (for tracing); load it on first use so light commands stay fast.
_LAZY = {"simulate": "echo_tune.sim.simulate", "StepReport": "echo_tune.sim.outputs.report",
         "BREAKDOWN_PARTS": "echo_tune.sim.outputs.report", "load_results": "echo_tune.results_api"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'echo_tune' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [
    "BREAKDOWN_PARTS", "CalibrationError", "ClusterProfile", "ClusterSpec", "ConfigError", "EchoTuneError",
    "GPUSpec", "InfeasibleConfigError", "Layout", "ModelSpec", "ParallelConfig", "StepReport", "check_compatible",
    "default_profile", "load_cluster", "load_gpu", "load_model", "load_profile", "load_results", "preset_names", "profile_for",
    "save_profile", "simulate",
]
