"""The host's time to issue one kernel when a profile states none: the value fitted on the published runs.

Every training step has one (Python, PyTorch dispatch, Transformer Engine and Megatron code between two kernel
launches from Python; ``cost/host/host_bound.py`` says where the GPU waits on it, and that the kernels TE's C++
launches inside a call cost the launch alone), and no datasheet gives it: a profile without it used to leave it at
0, so a pass of many short kernels (fine-grained MoE: a GEMM per local expert) ran at its GPU time alone, e.g.
Qwen3-30B-A3B on 16 H100 predicted 64% too fast. It is a property of the host and the software, not of the GPU, so
one value serves every GPU preset, labelled with where it comes from wherever a report names the profile.

The value is the ``fitted`` section of ``data/host-time-x86.yaml``, a profile written by the command in its header
(``echo-tune calibrate fit --runs <the developers' sets> --gpu h100-sxm,b200 --params host``): the rows of the GPUs
whose published runs ran on x86 hosts (DGX H100: Xeon Platinum 8480C; DGX B200: Xeon Platinum 8570), each with its
own GPU's profile; the A100 rows of 2021 never wait on the host. GB200 and GB300 run on Grace hosts, whose Python
runs slower (TransformerEngine issue 2053: a torch ``nn.Linear`` forward takes 33-37 us of CPU on GH200 / GB200
against 13.5 us on a DGX H100); their profiles take the same value, which docs/moe_experiments.md tried scaling
and left. What one value stands for: a traced op is a module call, which runs several Python-level torch calls
(Megatron's MoE layer forward: ~10 per traced op; a dense layer's ~5.5, counted in Megatron-LM's own code by
benchmarks/megatron_host_ops.py) at 13.5 us each on a DGX H100 (issue 2053): ~75-140 us per traced op; and the
one public host-side profile of an MoE layer (github.com/yanring/Megatron-MoE-ModelZoo issue 7, NVTX ranges,
8 B200 with x86 hosts) took 2.35 ms to issue 16 local experts' two GEMMs and activation: ~73 us per expert and
GEMM. The fit moves it only inside 13.5-140 us, a range fixed by those measurements (``calibrate/fit/fit_runs.py
HOST_TIME_RANGE_S``). A profile overrides it with its own ``fitted.params.host_time_per_kernel_s`` (0 turns it off).
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
    return Path(str(resources.files("echo_tune.cost").joinpath("data", "host-time-x86.yaml")))


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
    return f"host time per kernel {value * 1e6:.0f} us {shipped_fit().get('label', 'fitted')} (x86-host rows: H100, B200)"



def without_host(profile):
    """``profile`` with the host time per kernel at 0: the GPU side alone (what the fit stands in for shows as the
    difference; plan/host_share.py, docs/accuracy.md)."""
    fitted = dict(profile.fitted or {})
    fitted["params"] = {**(fitted.get("params") or {}), PARAM: 0.0}
    return dataclasses.replace(profile, fitted=fitted)
