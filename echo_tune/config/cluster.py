"""Hardware specs: a GPU type, and a cluster (a node type plus its fabric).

The number of GPUs is not part of a cluster: it comes with each run (``--num-gpus``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.config._checks import require, require_positive

PRECISIONS = ("bf16", "fp16", "fp32")


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """Datasheet numbers of one GPU type; ``source`` says where each number comes from."""

    name: str
    peak_bf16_tflops: float
    """Dense (no sparsity) bf16 tensor-core peak."""
    peak_fp16_tflops: float
    """Dense fp16 tensor-core peak."""
    peak_fp32_tflops: float
    """Plain fp32 (non tensor-core) peak."""
    memory_bytes: int
    """HBM capacity."""
    memory_bandwidth_gbyte_s: float
    """HBM bandwidth, GB/s (1e9 bytes)."""
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("peak_bf16_tflops", "peak_fp16_tflops", "peak_fp32_tflops", "memory_bytes",
                     "memory_bandwidth_gbyte_s"):
            require_positive(f"gpu.{name}", getattr(self, name))

    def peak_tflops(self, precision: str) -> float:
        return {"bf16": self.peak_bf16_tflops, "fp16": self.peak_fp16_tflops,
                "fp32": self.peak_fp32_tflops}[precision]


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """A node type and its fabric, with the YAML keys of a cluster file."""

    name: str
    gpu: GPUSpec
    gpus_per_node: int
    intra_node_bandwidth_gbyte_s: float
    """NVLink bandwidth per GPU, one direction, GB/s."""
    nics_per_node: int
    nic_bandwidth_gbit_s: float
    """Line rate of one NIC, Gb/s."""
    nodes_per_leaf: int | None = None
    """Nodes under one leaf (rail) switch of the fabric; None = every node on one non-blocking level."""
    spine_oversubscription: float = 1.0
    """Oversubscription of the spine level above the leaves (2.0 = half the leaf bandwidth goes up);
    a group whose nodes span several leaves has its network bandwidth divided by it."""
    profile: Path | None = None
    """Calibration profile file; None uses the GPU preset's datasheet-derived defaults."""
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "intra_node_bandwidth_gbyte_s", "nics_per_node", "nic_bandwidth_gbit_s"):
            require_positive(name, getattr(self, name))
        require(isinstance(self.gpus_per_node, int), f"`gpus_per_node` must be an integer, but got "
                                                     f"(gpus_per_node={self.gpus_per_node!r})")
        require(self.nodes_per_leaf is None or (isinstance(self.nodes_per_leaf, int) and self.nodes_per_leaf >= 1),
                f"`nodes_per_leaf` must be a positive integer or null, but got (nodes_per_leaf={self.nodes_per_leaf!r})")
        require(self.spine_oversubscription >= 1, f"`spine_oversubscription >= 1` must hold, but got "
                                                  f"(spine_oversubscription={self.spine_oversubscription})")

    def leaves_spanned(self, first_node_span: int) -> int:
        """Leaf switches under ``first_node_span`` consecutive nodes starting at a leaf boundary."""
        return 1 if self.nodes_per_leaf is None else -(-first_node_span // self.nodes_per_leaf)

    @property
    def inter_node_bandwidth_per_gpu_gbyte_s(self) -> float:
        """Line-rate network bandwidth a GPU gets when every GPU of the node sends at once, GB/s."""
        return self.nics_per_node * self.nic_bandwidth_gbit_s / 8.0 / self.gpus_per_node

    def replace(self, **changes) -> "ClusterSpec":
        return dataclasses.replace(self, **changes)
