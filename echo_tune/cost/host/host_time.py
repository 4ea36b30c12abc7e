"""The host's time to issue one kernel when a profile states none: the value fitted on the published runs.

Every training step has one (Python, PyTorch dispatch, Transformer Engine and Megatron code between two kernel
launches; ``cost/host/host_bound.py`` says where the GPU waits on it), and no datasheet gives it: a profile without
it used to leave it at 0, so a pass of many short kernels (fine-grained MoE: a GEMM and its quantisations per
expert) ran at its GPU time alone, e.g. Qwen3-30B-A3B on 16 H100 predicted 64% too fast. It is a property of
the host and the software, not of the GPU, so one value serves every GPU preset, labelled with where it comes
from wherever a report names the profile.

The value is the ``fitted`` section of ``data/host-time-h100.yaml``, a profile written by the command in its
header (``echo-tune calibrate fit --runs <the three published-run sets> --gpu h100-sxm --params host``): the
H100 rows only (the A100 rows of 2021 never wait on the host, the two B200 rows are too few), the clock left at
the preset's. A profile overrides it with its own ``fitted.params.host_time_per_kernel_s`` (0 turns it off).
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from importlib import resources
from pathlib import Path
from echo_tune.config.load.loading import read_yaml
from echo_tune.errors import ConfigError

PARAM = "host_time_per_kernel_s"


def shipped_fit_path() -> Path:
    return Path(str(resources.files("echo_tune.cost").joinpath("data", "host-time-h100.yaml")))


@lru_cache(maxsize=1)
def shipped_fit() -> dict:
    """The ``fitted`` section of the shipped fit ({} when the file is absent, e.g. while it is regenerated)."""
    path = shipped_fit_path()
    if not path.is_file():
        return {}
    fitted = read_yaml(path, "shipped host-time fit").get("fitted") or {}
    value = (fitted.get("params") or {}).get(PARAM)
    if not isinstance(value, (int, float)) or not 0 <= value < 1e-3:
        raise ConfigError(f"{path}: `0 <= fitted.params.{PARAM} < 1e-3` must hold, but got ({PARAM}={value!r}); "
                          f"regenerate it with the command in its header")
    return fitted


def default_host_time_s() -> float:
    """Host time per kernel of a profile that states none."""
    return float((shipped_fit().get("params") or {}).get(PARAM) or 0.0)


def default_label() -> str:
    """What a report of a profile using the default says about it."""
    value = default_host_time_s()
    if not value:
        return ""
    return f"host time per kernel {value * 1e6:.0f} us {shipped_fit().get('label', 'fitted')} (H100 rows)"



def without_host(profile):
    """``profile`` with the host time per kernel at 0: the GPU side alone (what the fit stands in for shows as the
    difference; plan/host_share.py, docs/accuracy.md)."""
    fitted = dict(profile.fitted or {})
    fitted["params"] = {**(fitted.get("params") or {}), PARAM: 0.0}
    return dataclasses.replace(profile, fitted=fitted)
