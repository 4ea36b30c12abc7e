"""The local device's identity, and the rule that a database measured on one device serves only it.

A CUDA device is named as ``torch.cuda.get_device_name`` names it ("NVIDIA H100 80GB HBM3"); a CPU as
``cpu: <model> (<n> threads)``, since the thread count changes every CPU time. A database row is for
the cluster when its kind fits (a GPU preset needs a CUDA row whose name contains the preset's model,
e.g. "h100" for ``h100-sxm``; a GPU named ``cpu...`` needs a CPU row).
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, kw_only=True)
class DeviceInfo:
    """Where op times were measured: the device and the software that ran them."""

    name: str
    """Device name (``torch.cuda.get_device_name`` or ``cpu: <model> (<n> threads)``)."""
    kind: str
    """"cuda" or "cpu"."""
    torch_version: str
    cuda_version: str
    """CUDA runtime torch was built with ("none" on a CPU build)."""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def local_device(kind: str | None = None):
    """(torch.device, DeviceInfo): where to measure (CUDA when present unless ``kind`` says otherwise)."""
    import torch

    kind = kind or ("cuda" if torch.cuda.is_available() else "cpu")
    versions = dict(torch_version=torch.__version__, cuda_version=torch.version.cuda or "none")
    if kind == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        return device, DeviceInfo(name=torch.cuda.get_device_name(device), kind="cuda", **versions)
    name = f"cpu: {_cpu_model()} ({torch.get_num_threads()} threads)"
    return torch.device("cpu"), DeviceInfo(name=name, kind="cpu", **versions)


def serves(device_name: str, device_kind: str, gpu_name: str) -> bool:
    """Whether times measured on ``device_name`` may stand for the cluster GPU ``gpu_name``."""
    gpu = gpu_name.lower()
    if gpu.startswith("cpu"):
        return device_kind == "cpu"
    model = re.split(r"[-_ ]", gpu)[0]
    return device_kind == "cuda" and model in re.split(r"[-_ ]", device_name.lower())
