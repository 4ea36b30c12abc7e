"""Calibration profiles: every coefficient the cost models use, as data.

A profile is either *measured* (fitted by ``echo-tune calibrate fit``) or *datasheet-derived*
(``default_profile``: datasheet peaks times stated efficiency assumptions). Reports say which.

The YAML layout (version 1), key by key: docs/calibration.md, "The profile file".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from echo_tune.config._checks import require, require_positive
from echo_tune.config.specs.cluster import ClusterSpec, GPUSpec
from echo_tune.config.load.loading import check_keys, read_yaml
from echo_tune.cost.datasheet_efficiencies import (
    DATASHEET_ATTENTION_BACKWARD_EFFICIENCY, DATASHEET_ATTENTION_CAUSAL_FACTOR, DATASHEET_ATTENTION_EFFICIENCY,
    DATASHEET_COMM_SLOWDOWN, DATASHEET_COMPUTE_SLOWDOWN, DATASHEET_FP8_GEMM_EFFICIENCY, DATASHEET_GEMM_EFFICIENCY,
    DATASHEET_GEMM_HALF_SATURATION_DIM, DATASHEET_INTER_LATENCY_S, DATASHEET_INTRA_LATENCY_S, DATASHEET_KERNEL_LAUNCH_S,
    DATASHEET_LINK_EFFICIENCY, DATASHEET_MEMORY_EFFICIENCY)
from echo_tune.cost.kernels.gemm_benchmarks import benchmark_efficiencies
from echo_tune.cost.host.host_time import default_host_time_s, default_label
from echo_tune.cost.collectives.link_coefficients import LinkCoefficients
from echo_tune.cost.optime.optime_db import load_op_times
from echo_tune.cost.profile_bounds import check_clock_in_use, check_profile_numbers
from echo_tune.errors import ConfigError
from echo_tune.io import write_text
from echo_tune.limits import PROFILE_LIMITS, check_number, first_non_finite

if TYPE_CHECKING:
    from echo_tune.cost.optime.optime_db import OpTimes

PROFILE_VERSION = 1
SCOPES = ("intra_node", "inter_node")



@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    """All cost-model coefficients of one cluster (a cluster profile: `calibration/<cluster>/profile.yaml`,
    datasheet-derived or calibrated). Not to be confused with an op-time database (``cost/optime/optime_db.py``:
    ``OpTimeDB``) or the ``echo-tune profile`` command, which fills one."""

    name: str
    gpu: str
    measured: bool
    gemm_max_efficiency: float
    gemm_half_saturation_dim: float
    memory_bandwidth_gbyte_s: float
    kernel_launch_overhead_s: float
    attention_efficiency: float
    comm: dict[str, dict[str, LinkCoefficients]]
    fp8_gemm_max_efficiency: float = DATASHEET_FP8_GEMM_EFFICIENCY
    """Fraction of the dense FP8 peak large FP8 GEMMs reach (``gemm_max_efficiency`` for FP8)."""
    attention_backward_efficiency: float | None = None
    """Fraction of dense peak the fused attention *backward* reaches; None = ``attention_efficiency``
    (which is then the forward's and the backward's)."""
    attention_causal_factor: float = 1.0
    """Rate of a causal-masked fused-attention *forward* kernel relative to an unmasked one (the two
    efficiencies above are the unmasked kernels'); 1 = no difference. Backward kernels: no causal factor
    (no public measurement of a causal backward to take it from)."""
    compute_slowdown: float = 1.0
    comm_slowdown: float = 1.0
    slowdown_curves: dict = field(default_factory=dict)
    """Measured slowdown curves behind the two scalars above (written by ``calibrate fit``)."""
    provenance: dict = field(default_factory=dict)
    measured_on: dict = field(default_factory=dict)
    """Where the measurements were taken: ``backend`` (nccl, gloo, nccl-tests), ``device`` (cuda, cpu),
    ``gpu`` (name), and ``cpu_override: true`` when a CPU measurement was allowed for a GPU cluster."""
    version: int = PROFILE_VERSION
    op_times_db: str | None = None
    """The ``op_times`` key as written: an op-time database file (relative to the profile file)."""
    op_times: "OpTimes | None" = field(default=None, compare=False, repr=False)
    """Its measured times for the profile's GPU, loaded with the profile (``cost/optime/optime_db.py``)."""
    fitted: dict = field(default_factory=dict)
    """Parameters fitted on training runs and their provenance (``calibrate fit --runs``): ``params``
    (``sustained_clock_mhz``: compute-bound kernels' clock; ``comm_time_factor``: every collective's time
    times this; ``kernel_launch_overhead_s``: copied into the field above; ``host_time_per_kernel_s``: absent,
    the shipped one, cost/host/host_time.py), ``label``, rows and errors."""
    nccl_ring_only: bool = False
    """NCCL_ALGO=Ring (set by ``--deterministic-mode``, sim/features/determinism.py): no tree all-reduce. Not a
    profile-file key: set per simulated run."""

    def __post_init__(self) -> None:
        for name in ("gemm_max_efficiency", "attention_efficiency", "fp8_gemm_max_efficiency",
                     "attention_backward_efficiency", "attention_causal_factor"):
            value = getattr(self, name)
            if value is None and name == "attention_backward_efficiency":
                continue
            require(0 < value <= 1, f"`0 < {name} <= 1` must hold, but got ({name}={value})")
        for name in ("gemm_half_saturation_dim", "memory_bandwidth_gbyte_s"):
            require_positive(name, getattr(self, name))
        check_number("kernel_launch_overhead_s", self.kernel_launch_overhead_s)  # >= 0: issue 10
        for name in ("compute_slowdown", "comm_slowdown"):
            value = getattr(self, name)
            require(value >= 1, f"`{name} >= 1` must hold, but got ({name}={value})")
        for scope in SCOPES:
            require(scope in self.comm and "default" in self.comm[scope],
                    f"profile {self.name!r} needs comm.{scope}.default coefficients")
        require(isinstance(self.fitted, dict), f"profile {self.name!r}: `fitted` must be a mapping, but got "
                                               f"(fitted={self.fitted!r})")
        params = self.fitted.get("params") or {}
        require(isinstance(params, dict), f"profile {self.name!r}: `fitted.params` must be a mapping, but got "
                                          f"(params={params!r})")
        for name in ("sustained_clock_mhz", "comm_time_factor", "host_time_per_kernel_s"):  # host time 0: never waits
            if params.get(name) is not None:
                check_number(name, params[name], PROFILE_LIMITS[name], flag=f"fitted.params.{name}")
        factor = self.comm_time_factor
        if factor != 1.0:  # every collective's time x factor: latencies x f, bandwidths / f (all tiers)
            object.__setattr__(self, "_scaled_comm", {s: {c: _scaled(v, factor) for c, v in t.items()}
                                                      for s, t in self.comm.items()})

    @property
    def fitted_clock_mhz(self) -> float | None:
        """The compute-bound clock fitted on training runs (None: not fitted)."""
        return (self.fitted.get("params") or {}).get("sustained_clock_mhz")

    @property
    def comm_time_factor(self) -> float:
        """Fitted factor on every collective's modelled time (1: not fitted)."""
        return float((self.fitted.get("params") or {}).get("comm_time_factor") or 1.0)

    @property
    def host_time_per_kernel_s(self) -> float:
        """Host time to issue one kernel (``cost/host/host_bound.py``): the profile's fitted one, else the one fitted on
        the published runs (``cost/host/host_time.py``; 0 in the profile: the GPU never waits on the host)."""
        value = (self.fitted.get("params") or {}).get("host_time_per_kernel_s")
        return float(value) if value is not None else default_host_time_s()

    @property
    def uses_default_host_time(self) -> bool:
        """Whether ``host_time_per_kernel_s`` is the shipped default (``cost/host/host_time.py``), not the profile's."""
        return (self.fitted.get("params") or {}).get("host_time_per_kernel_s") is None and default_host_time_s() > 0

    @property
    def attention_bwd_efficiency(self) -> float:
        """The fused-attention backward efficiency in use (``attention_efficiency`` when not set)."""
        return self.attention_backward_efficiency or self.attention_efficiency

    def link(self, scope: str, collective: str) -> LinkCoefficients:
        table = getattr(self, "_scaled_comm", self.comm)[scope]
        return table.get(collective, table["default"])

    @property
    def measured_on_cpu(self) -> bool:
        return (self.measured_on or {}).get("device") == "cpu"

    @property
    def label(self) -> str:
        if not self.measured:
            label = "datasheet-derived (not measured)"
        elif self.measured_on_cpu:
            label = (f"measured on CPU ({self.measured_on.get('backend', 'gloo')}), NOT a GPU measurement: "
                     f"used by explicit override")
        else:
            label = "measured"
        if self.provenance.get("gemm_benchmarks"):
            label += f"; {self.provenance['gemm_benchmarks']}"
        if self.op_times is not None:
            label += f"; op times measured on {self.op_times.device!r}"
        if self.fitted.get("label"):
            label += f"; {self.fitted['label']}"
        if self.uses_default_host_time:
            label += f"; {default_label()}"
        return label

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["comm"] = {s: {c: v.to_dict() for c, v in t.items()} for s, t in self.comm.items()}
        compute = {k: data.pop(k) for k in ("gemm_max_efficiency", "gemm_half_saturation_dim",
                                            "memory_bandwidth_gbyte_s", "kernel_launch_overhead_s",
                                            "attention_efficiency", "fp8_gemm_max_efficiency")}
        backward = data.pop("attention_backward_efficiency")
        if backward is not None:
            compute["attention_backward_efficiency"] = backward
        causal = data.pop("attention_causal_factor")
        if causal != 1.0:
            compute["attention_causal_factor"] = causal
        interference = {k: data.pop(k) for k in ("compute_slowdown", "comm_slowdown")}
        curves = data.pop("slowdown_curves")
        if curves:
            interference["slowdown_curves"] = curves
        head = {k: data.pop(k) for k in ("version", "name", "measured", "gpu", "measured_on", "provenance")}
        if not head["measured_on"]:
            del head["measured_on"]
        tail = {"op_times": self.op_times_db} if self.op_times_db else {}
        if self.fitted:
            tail["fitted"] = data.pop("fitted")
        return {**head, "compute": compute, "comm": data.pop("comm"), "interference": interference, **tail}


def _scaled(link: LinkCoefficients, factor: float) -> LinkCoefficients:
    """``link`` with every time it gives multiplied by ``factor`` (latencies x f, bandwidth / f)."""
    return dataclasses.replace(link, latency_s=link.latency_s * factor, base_latency_s=link.base_latency_s * factor,
                               bus_bandwidth_gbyte_s=link.bus_bandwidth_gbyte_s / factor,
                               protocols={k: _scaled(v, factor) for k, v in link.protocols.items()})


def default_profile(cluster: ClusterSpec) -> ClusterProfile:
    """Datasheet-derived profile for a cluster (labelled as not measured)."""
    gpu: GPUSpec = cluster.gpu
    intra = LinkCoefficients(latency_s=DATASHEET_INTRA_LATENCY_S,
                             bus_bandwidth_gbyte_s=cluster.intra_node_bandwidth_gbyte_s * DATASHEET_LINK_EFFICIENCY)
    inter = LinkCoefficients(latency_s=DATASHEET_INTER_LATENCY_S,
                             bus_bandwidth_gbyte_s=cluster.inter_node_bandwidth_per_gpu_gbyte_s
                             * DATASHEET_LINK_EFFICIENCY)
    benchmarked, benchmark_note = benchmark_efficiencies(gpu, DATASHEET_GEMM_HALF_SATURATION_DIM)
    return ClusterProfile(
        name=f"{cluster.name}-datasheet", gpu=gpu.name, measured=False,
        gemm_max_efficiency=benchmarked.get("gemm_max_efficiency", DATASHEET_GEMM_EFFICIENCY),
        fp8_gemm_max_efficiency=benchmarked.get("fp8_gemm_max_efficiency", DATASHEET_FP8_GEMM_EFFICIENCY),
        gemm_half_saturation_dim=DATASHEET_GEMM_HALF_SATURATION_DIM,
        memory_bandwidth_gbyte_s=gpu.memory_bandwidth_gbyte_s * DATASHEET_MEMORY_EFFICIENCY,
        kernel_launch_overhead_s=DATASHEET_KERNEL_LAUNCH_S,
        attention_efficiency=DATASHEET_ATTENTION_EFFICIENCY,
        attention_backward_efficiency=DATASHEET_ATTENTION_BACKWARD_EFFICIENCY,
        attention_causal_factor=DATASHEET_ATTENTION_CAUSAL_FACTOR,
        comm={"intra_node": {"default": intra}, "inter_node": {"default": inter}},
        compute_slowdown=DATASHEET_COMPUTE_SLOWDOWN, comm_slowdown=DATASHEET_COMM_SLOWDOWN,
        provenance={"source": f"datasheet numbers of {gpu.name} ({gpu.source}) and {cluster.name} "
                              f"({cluster.source}) times the DATASHEET_* efficiencies in "
                              f"cost/datasheet_efficiencies.py",
                    **({"gemm_benchmarks": benchmark_note} if benchmark_note else {})})


def profile_from_dict(data: dict, *, where: str = "profile", base_dir: Path | None = None) -> ClusterProfile:
    """Parse the YAML layout above; unknown or missing keys give one-line ConfigErrors.

    ``op_times`` is read relative to ``base_dir`` (the profile file's folder), else the working folder.
    """
    check_keys(data, ("version", "name", "measured", "gpu", "measured_on", "provenance", "compute", "comm",
                      "interference", "op_times", "fitted"), where)
    version = data.get("version", PROFILE_VERSION)
    require(version == PROFILE_VERSION, f"{where}: `version == {PROFILE_VERSION}` must hold, but got (version={version})")
    db = data.get("op_times")
    require(db is None or isinstance(db, str), f"{where}: `op_times` must be a file path, but got (op_times={db!r})")
    check_profile_numbers(data, where)  # physical bounds, each named by its key in the file (issue 41)
    op_times = None
    if db is not None:
        path = Path(db) if Path(db).is_absolute() or base_dir is None else base_dir / db
        op_times = load_op_times(path, str(data.get("gpu", "")))
    try:
        comm = {scope: {name: LinkCoefficients(**coeffs) for name, coeffs in table.items()}
                for scope, table in (data.get("comm") or {}).items()}
        return ClusterProfile(name=data.get("name", where), gpu=data.get("gpu", ""),
                                  measured=bool(data.get("measured", False)), comm=comm,
                                  provenance=data.get("provenance") or {}, version=version,
                                  measured_on=data.get("measured_on") or {},
                                  op_times_db=db, op_times=op_times, fitted=data.get("fitted") or {},
                                  **(data.get("compute") or {}), **(data.get("interference") or {}))
    except (TypeError, AttributeError) as exc:
        raise ConfigError(f"{where}: bad profile contents: {exc}") from None


def load_profile(path: str | Path) -> ClusterProfile:
    path = Path(path)
    return profile_from_dict(read_yaml(path, "profile"), where=f"profile {str(path)!r}", base_dir=path.parent)


def save_profile(profile: ClusterProfile, path: str | Path, header: str = "") -> None:
    data = profile.to_dict()
    bad = first_non_finite(data)
    if bad:  # never write a profile of NaNs (a fit that diverged): issue 10
        raise ConfigError(f"profile {profile.name!r}: `{bad[0]}` is {bad[1]!r}, not a finite number; the fit did "
                          f"not converge: check the inputs' residuals (--show-points) or fit fewer tiers")
    check_profile_numbers(data, f"profile {profile.name!r} (not written)")  # one it could not read back
    write_text(path, header + yaml.safe_dump(data, sort_keys=False), "profile")


def profile_for(cluster: ClusterSpec) -> ClusterProfile:
    """The cluster's own profile file if it names one, else the datasheet-derived default."""
    return load_profile(cluster.profile) if cluster.profile is not None else default_profile(cluster)


def load_cluster_profile(cluster: ClusterSpec) -> ClusterProfile:
    """``profile_for`` (the cluster's profile file, else its datasheet-derived default)."""
    return profile_for(cluster)


def check_profile_device(profile: ClusterProfile, cluster: ClusterSpec) -> None:
    """Refuse a CPU-measured profile for a GPU cluster without the explicit override; a fitted clock its GPU lacks."""
    check_clock_in_use(profile.name, profile.fitted_clock_mhz, cluster)
    if profile.measured and profile.measured_on_cpu and not profile.measured_on.get("cpu_override"):
        raise ConfigError(f"profile {profile.name!r} was measured on CPU ({profile.measured_on.get('backend', 'gloo')}) "
                          f"but cluster {cluster.name!r} has {cluster.gpu.name} GPUs; fit it from a GPU bench or "
                          f"nccl-tests logs, or refit with `calibrate fit --allow-cpu-bench` to use it anyway")


def profile_warnings(profile: ClusterProfile, cluster: ClusterSpec) -> list[str]:
    """Notes every report of this profile on this cluster shows."""
    check_profile_device(profile, cluster)
    if profile.measured and profile.measured_on_cpu:
        return [f"profile {profile.name!r} is {profile.label}; its numbers say nothing about {cluster.gpu.name} GPUs"]
    return []
