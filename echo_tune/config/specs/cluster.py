"""Hardware specs: a GPU type, and a cluster (a node type plus its fabric).

The number of GPUs is not part of a cluster: it comes with each run (``--num-gpus``).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.config._checks import require, require_positive
from echo_tune.errors import ConfigError
from echo_tune.limits import HARDWARE_LIMITS, MAX_CLOCK_OVER_PEAK, check_number

PRECISIONS = ("bf16", "fp16", "fp32")
# Tensor-core formats a GPU may also offer (FP8 GEMMs under --fp8-format; FP4 is listed, not simulated).
LOW_PRECISIONS = ("fp8", "fp4")


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
    peak_fp8_tflops: float | None = None
    """Dense fp8 tensor-core peak; None = the GPU has no fp8 tensor cores (A100): FP8 is refused."""
    peak_fp4_tflops: float | None = None
    """Dense fp4 tensor-core peak (Blackwell); listed for reference, FP4 training is not simulated."""
    sm_count: int | None = None
    """Streaming multiprocessors (SMs a communication kernel takes are a share of these)."""
    peak_clock_mhz: float | None = None
    """SM clock the tensor-core peaks are specified at (SMs x FLOPs/clock/SM x this clock = the peak)."""
    sustained_clock_mhz: float | None = None
    """SM clock the GPU sustains on compute-bound kernels at its default power limit; compute-bound kernel
    time scales with ``peak_clock_mhz / sustained_clock_mhz`` (``clock_factor``), memory-bound time does not.
    None = the peak clock (no public measurement)."""
    compute_capability: str | None = None
    """CUDA compute capability, "major.minor" (9.0 Hopper, 10.0 B200 / GB200): which FP8 GEMM layouts the tensor cores
    take. From 10.0 per-tensor-scaled FP8 GEMMs take any layout (TransformerEngine v2.10 ``utils.py``
    ``is_non_tn_fp8_gemm_supported``: 10.0 <= cc < 12.0 or cc >= 13.0) and TE quantises to a row-wise copy alone;
    before, only "TN", and TE writes a transposed copy too (``fp8_any_layout``). None: TN only, as Hopper."""
    sustained_clock_derived_from: str | None = None
    """Where ``sustained_clock_mhz`` is not measured on this GPU but derived: from what (reports say so and how
    to give a measured one); None = measured (its source in ``source`` or the preset file's comments)."""
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("peak_bf16_tflops", "peak_fp16_tflops", "peak_fp32_tflops", "memory_bytes",
                     "memory_bandwidth_gbyte_s"):
            require_positive(f"gpu.{name}", getattr(self, name))
        for name in ("peak_fp8_tflops", "peak_fp4_tflops", "peak_clock_mhz", "sustained_clock_mhz"):
            if getattr(self, name) is not None:
                require_positive(f"gpu.{name}", getattr(self, name))
        require(self.compute_capability is None or re.fullmatch(r"\d+\.\d+", str(self.compute_capability)) is not None,
                f"gpu {self.name!r}: `compute_capability` must be \"major.minor\" as NVIDIA lists it, but got "
                f"(compute_capability={self.compute_capability!r}); write e.g. compute_capability: \"9.0\"")
        require(self.sustained_clock_derived_from is None or self.sustained_clock_mhz is not None,
                f"gpu {self.name!r}: `sustained_clock_derived_from` says where `sustained_clock_mhz` comes from, but got "
                f"(sustained_clock_derived_from={self.sustained_clock_derived_from!r}, sustained_clock_mhz=None); "
                f"give the clock, or drop the key")
        if self.sustained_clock_mhz is not None:
            require(self.peak_clock_mhz is not None,
                    f"gpu {self.name!r}: `sustained_clock_mhz` needs `peak_clock_mhz` (the clock the peak TFLOP/s are "
                    f"specified at), but got (sustained_clock_mhz={self.sustained_clock_mhz}, peak_clock_mhz=None)")
        _check_bounds(self, "gpu.")
        if self.sustained_clock_mhz is not None:
            check_clock(self, self.sustained_clock_mhz, "gpu.sustained_clock_mhz")

    @property
    def fp8_any_layout(self) -> bool:
        """Whether per-tensor-scaled FP8 GEMMs take non-TN layouts (``compute_capability``; TE's rule)."""
        if self.compute_capability is None:
            return False
        cc = tuple(int(x) for x in self.compute_capability.split("."))
        return (10, 0) <= cc < (12, 0) or cc >= (13, 0)

    @property
    def ex2_per_s(self) -> float | None:
        """Base-2 exponentials the SFUs evaluate per second at the sustained clock (softmax's ``MUFU.EX2``): 16
        per clock and SM through compute capability 10.0 (CUDA C++ Programming Guide, "Arithmetic Instructions"
        throughput table: exp2f), doubled on Blackwell Ultra, 10.3 (NVIDIA technical blog "Inside NVIDIA Blackwell
        Ultra", table 2: 10.7 against Blackwell's 5 TeraExponentials/s); None without SM count, clock or compute
        capability."""
        clock = self.sustained_clock_mhz or self.peak_clock_mhz
        if self.sm_count is None or clock is None or self.compute_capability is None:
            return None
        per_sm = 32 if self.compute_capability == "10.3" else 16
        return self.sm_count * per_sm * clock * 1e6

    @property
    def clock_factor(self) -> float:
        """Sustained over peak clock: the share of the datasheet tensor-core rate compute-bound kernels get."""
        if self.sustained_clock_mhz is None or self.peak_clock_mhz is None:
            return 1.0
        return self.sustained_clock_mhz / self.peak_clock_mhz

    def check_headroom(self, headroom_gib: float, name: str = "--memory-headroom-gib") -> None:
        """Refuse (one line) a memory headroom that leaves no HBM at all for a layout to fit in."""
        hbm_gib = self.memory_bytes / 2**30
        if not headroom_gib < hbm_gib:
            raise ConfigError(f"`{name} < HBM` must hold (a layout fits only under HBM less the headroom), but got "
                              f"({name.lstrip('-').replace('-', '_')}={headroom_gib:g}, HBM={hbm_gib:.1f} GiB on "
                              f"{self.name}); lower it")

    def replace(self, **changes) -> "GPUSpec":
        return dataclasses.replace(self, **changes)

    def peak_tflops(self, precision: str) -> float:
        if precision in LOW_PRECISIONS:
            peak = getattr(self, f"peak_{precision}_tflops")
            require(peak is not None, f"GPU {self.name!r} has no {precision} tensor cores "
                                      f"(peak_{precision}_tflops is not set); train in bf16 or pick a GPU with "
                                      f"{precision} support (H100, H200, B200)")
            return peak
        return {"bf16": self.peak_bf16_tflops, "fp16": self.peak_fp16_tflops,
                "fp32": self.peak_fp32_tflops}[precision]


def _check_bounds(spec, prefix: str) -> None:
    """Every hardware number of ``spec`` within its physical bounds (``echo_tune.limits.HARDWARE_LIMITS``)."""
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if f.name in HARDWARE_LIMITS and value is not None and f.name != "sustained_clock_mhz":  # check_clock
            check_number(f.name, value, flag=prefix + f.name)


def check_clock(gpu: GPUSpec, clock: float, name: str) -> None:
    """A sustained SM clock (a cluster's or GPU's ``sustained_clock_mhz``, ``--gpu-clock-mhz``): within the bounds
    of any GPU, and at most the GPU's boost clock, ``MAX_CLOCK_OVER_PEAK`` x the clock its peak is specified at."""
    peak = gpu.peak_clock_mhz
    if peak is None or not clock > MAX_CLOCK_OVER_PEAK * peak:
        check_number("sustained_clock_mhz", clock, flag=name)
    else:
        raise ConfigError(f"`{name} <= {MAX_CLOCK_OVER_PEAK:g} x peak_clock_mhz` must hold (the SM clock under load, "
                          f"from --gpu-clock-mhz or a cluster's `sustained_clock_mhz`, is at most the GPU's boost "
                          f"clock: H100 SXM boosts to 1,980 MHz over the 1,830 its peak is specified at), but got "
                          f"({name}={clock:g}, peak_clock_mhz={peak:g} on {gpu.name}); give the SM clock nvidia-smi "
                          f"shows during training, in MHz")


def clock_note(gpu: GPUSpec) -> str | None:
    """What a report says when compute-bound kernels run at the clock the GPU's peak is specified at for want of
    a sustained clock (no preset value, no cluster key, no --gpu-clock-mhz, no clock fitted on runs): its step
    time may be optimistic; or at a sustained clock derived, not measured (``sustained_clock_derived_from``).
    None when a measured (or given) sustained clock is in use."""
    if gpu.sustained_clock_mhz is not None:
        if gpu.sustained_clock_derived_from is None:
            return None
        return (f"{gpu.name}: compute-bound kernels run at {gpu.sustained_clock_mhz:,.0f} MHz, a sustained clock not "
                f"measured on it but derived from {gpu.sustained_clock_derived_from}: set `sustained_clock_mhz` in the "
                f"cluster file or pass --gpu-clock-mhz (the SM clock nvidia-smi shows during training)")
    at = f"the {gpu.peak_clock_mhz:,.0f} MHz its peak TFLOP/s are specified at" if gpu.peak_clock_mhz \
        else "its datasheet peak TFLOP/s"
    return (f"{gpu.name}: compute-bound kernels run at {at}, as no clock it sustains under load is known; under a "
            f"training step's power draw GPUs hold less (B200 1,965 -> ~1,580 MHz, flashinfer PR 2899), so this step "
            f"time may be optimistic: set `sustained_clock_mhz` in the cluster file or pass --gpu-clock-mhz (the SM "
            f"clock nvidia-smi shows during training)")


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
    nvlink_domain_size: int | None = None
    """GPUs that share one NVLink domain (72 on a GB200 NVL72 rack); None = ``gpus_per_node``. A
    process group inside one NVLink domain communicates over NVLink even across compute trays."""
    profile: Path | None = None
    """Calibration profile file; None uses the GPU preset's datasheet-derived defaults."""
    sustained_clock_mhz: float | None = None
    """SM clock this cluster's GPUs sustain under load (measured, e.g. ``nvidia-smi -q -d CLOCK`` during
    training); overrides the GPU preset's and a fitted profile's. None = those."""
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "intra_node_bandwidth_gbyte_s", "nics_per_node", "nic_bandwidth_gbit_s"):
            require_positive(name, getattr(self, name))
        if self.sustained_clock_mhz is not None:
            require_positive("sustained_clock_mhz", self.sustained_clock_mhz)
            require(self.gpu.peak_clock_mhz is not None,
                    f"`sustained_clock_mhz` needs the GPU's `peak_clock_mhz`, but GPU {self.gpu.name!r} has none; "
                    f"add peak_clock_mhz to the gpu mapping")
        require(isinstance(self.gpus_per_node, int), f"`gpus_per_node` must be an integer, but got "
                                                     f"(gpus_per_node={self.gpus_per_node!r})")
        require(self.nodes_per_leaf is None or (isinstance(self.nodes_per_leaf, int) and self.nodes_per_leaf >= 1),
                f"`nodes_per_leaf` must be a positive integer or null, but got (nodes_per_leaf={self.nodes_per_leaf!r})")
        require(self.spine_oversubscription >= 1, f"`spine_oversubscription >= 1` must hold, but got "
                                                  f"(spine_oversubscription={self.spine_oversubscription})")
        _check_bounds(self, "")
        if self.sustained_clock_mhz is not None:
            check_clock(self.gpu, self.sustained_clock_mhz, "sustained_clock_mhz")
        if self.nvlink_domain_size is not None:
            domain = self.nvlink_domain_size
            require(isinstance(domain, int) and domain >= self.gpus_per_node and domain % self.gpus_per_node == 0,
                    f"`nvlink_domain_size % gpus_per_node == 0` and `nvlink_domain_size >= gpus_per_node` must "
                    f"hold, but got (nvlink_domain_size={domain!r}, gpus_per_node={self.gpus_per_node}); "
                    f"give whole nodes per NVLink domain")

    def leaves_spanned(self, first_node_span: int) -> int:
        """Leaf switches under ``first_node_span`` consecutive nodes starting at a leaf boundary."""
        return 1 if self.nodes_per_leaf is None else -(-first_node_span // self.nodes_per_leaf)

    @property
    def nvlink_domain_gpus(self) -> int:
        """GPUs reachable over NVLink from one GPU (its NVLink domain)."""
        return self.nvlink_domain_size or self.gpus_per_node

    @property
    def inter_node_bandwidth_per_gpu_gbyte_s(self) -> float:
        """Line-rate network bandwidth a GPU gets when every GPU of the node sends at once, GB/s."""
        return self.nics_per_node * self.nic_bandwidth_gbit_s / 8.0 / self.gpus_per_node

    def replace(self, **changes) -> "ClusterSpec":
        return dataclasses.replace(self, **changes)
