"""The local device's identity, and the rule that a database measured on one device serves only it.

A CUDA device is named as ``torch.cuda.get_device_name`` names it ("NVIDIA H100 80GB HBM3"); a CPU as
``cpu: <model> (<n> threads)``, since the thread count changes every CPU time. A database row is for
the cluster when the device is the cluster's GPU (``mismatch``): a GPU preset needs a CUDA row of the
same model, memory size and form factor (``NVIDIA A100-SXM4-40GB`` serves ``a100-40gb``, not
``a100-80gb``); a GPU named ``cpu...`` needs a CPU row.
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
    # lazy: loads torch (~1.5 s to import), which importing cost.optime_device does not
    import torch

    kind = kind or ("cuda" if torch.cuda.is_available() else "cpu")
    versions = dict(torch_version=torch.__version__, cuda_version=torch.version.cuda or "none")
    if kind == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        return device, DeviceInfo(name=torch.cuda.get_device_name(device), kind="cuda", **versions)
    name = f"cpu: {_cpu_model()} ({torch.get_num_threads()} threads)"
    return torch.device("cpu"), DeviceInfo(name=name, kind="cpu", **versions)


_FORMS = {"sxm": "sxm", "pcie": "pcie", "nvl": "nvl"}
"""Form factors a device or GPU name may carry (``SXM4`` counts as ``sxm``)."""


def _tokens(name: str) -> list[str]:
    return [t for t in re.split(r"[-_ ()]", name.lower()) if t]


def _memory_gb(tokens: list[str]) -> int | None:
    for t in tokens:
        m = re.fullmatch(r"(\d+)gb", t)
        if m:
            return int(m.group(1))
    return None


def _form(tokens: list[str]) -> str | None:
    for t in tokens:
        m = re.fullmatch(r"(sxm|pcie|nvl)\d*", t)
        if m:
            return _FORMS[m.group(1)]
    return None


def mismatch(device_name: str, device_kind: str, gpu_name: str, memory_bytes: int | None = None) -> str | None:
    """Why times measured on ``device_name`` may not stand for the cluster GPU ``gpu_name``; None when they may.

    The rule: a CPU serves a ``cpu...`` GPU only; a CUDA device serves a GPU of the same model (the GPU
    name's first word, e.g. "a100" of ``a100-80gb``, is a word of the device name), the same memory size
    (an "NNGB" word in both names must agree; one in the device name must match ``memory_bytes`` within
    5%) and the same form factor (SXM, PCIe, NVL, where both names say it): an A100-SXM4-40GB does not
    serve an ``a100-80gb``."""
    gpu, device = _tokens(gpu_name), _tokens(device_name)
    if gpu_name.lower().startswith("cpu"):
        return None if device_kind == "cpu" else "a CPU cluster's GPU stands for a CPU, not a CUDA device"
    if device_kind != "cuda":
        return "this is a CPU, not a GPU"
    if not gpu or gpu[0] not in device:
        return f"the GPU model differs: {gpu[0] if gpu else gpu_name!r} is not in the device name"
    device_gb, gpu_gb = _memory_gb(device), _memory_gb(gpu)
    if device_gb is not None and gpu_gb is not None and device_gb != gpu_gb:
        return f"the memory size differs: {device_gb} GB against {gpu_gb} GB"
    if device_gb is not None and memory_bytes and abs(device_gb * 2**30 / memory_bytes - 1) > 0.05:
        return f"the memory size differs: {device_gb} GB against {memory_bytes / 2**30:.0f} GiB"
    device_form, gpu_form = _form(device), _form(gpu)
    if device_form and gpu_form and device_form != gpu_form:
        return f"the form factor differs: {device_form} against {gpu_form}"
    return None


def serves(device_name: str, device_kind: str, gpu_name: str, memory_bytes: int | None = None) -> bool:
    """Whether times measured on ``device_name`` may stand for the cluster GPU ``gpu_name`` (``mismatch``)."""
    return mismatch(device_name, device_kind, gpu_name, memory_bytes) is None
