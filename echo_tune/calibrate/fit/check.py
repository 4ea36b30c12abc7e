"""``echo-tune calibrate check``: a profile's prediction against an nccl-tests log it was not fitted on.

Predictions come from ``cost.comm.collective_time_s``, the function the simulator uses, with the
group placed as the log's header says (GPU count, hosts). Errors are (predicted - measured) /
measured of the out-of-place time, per message size.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.calibrate.logs.log_checks import check_log_for_cluster
from echo_tune.calibrate.logs.nccl_tests import parse_nccl_tests
from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import ClusterProfile, profile_warnings
from echo_tune.errors import CalibrationError

# Extrapolation past this many times the largest fitted group (or node count) gets a warning.
FAR_EXTRAPOLATION = 4


@dataclass(frozen=True, kw_only=True)
class CheckPoint:
    size_bytes: int
    predicted_time_us: float
    measured_time_us: float

    @property
    def relative_error(self) -> float:
        return (self.predicted_time_us - self.measured_time_us) / self.measured_time_us


@dataclass(kw_only=True)
class CheckResult:
    path: str
    collective: str
    num_gpus: int
    num_nodes: int
    ranks_per_node: int
    points: list[CheckPoint]
    warnings: list[str] = field(default_factory=list)

    def max_abs_error(self, min_size_bytes: int = 0) -> float:
        return max((abs(p.relative_error) for p in self.points if p.size_bytes >= min_size_bytes), default=0.0)

    def points_over(self, max_error: float, min_size_bytes: int = 1 << 20) -> list[CheckPoint]:
        """Points of at least ``min_size_bytes`` whose |error| exceeds ``max_error`` (a fraction)."""
        return [p for p in self.points if p.size_bytes >= min_size_bytes and abs(p.relative_error) > max_error]

    def to_json(self) -> dict:
        """The layout of ``calibrate check --json``."""
        return {"collective": self.collective, "num_gpus": self.num_gpus, "num_nodes": self.num_nodes,
                "points": [{"size_bytes": p.size_bytes, "predicted_time_us": round(p.predicted_time_us, 3),
                            "measured_time_us": p.measured_time_us} for p in self.points],
                "warnings": list(self.warnings)}


def placement_for(cluster: ClusterSpec, num_gpus: int) -> GroupPlacement:
    """A group of ``num_gpus`` filling whole nodes of the cluster (as Megatron's DP groups of full nodes do)."""
    per_node = min(num_gpus, cluster.gpus_per_node)
    if num_gpus % per_node:
        raise CalibrationError(f"`num_gpus % gpus_per_node == 0` must hold past one node, but got "
                               f"(num_gpus={num_gpus}, gpus_per_node={cluster.gpus_per_node}); use whole nodes")
    return on_fabric(GroupPlacement(size=num_gpus, ranks_per_node=per_node, num_nodes=num_gpus // per_node), cluster)


def on_fabric(place: GroupPlacement, cluster: ClusterSpec) -> GroupPlacement:
    """The placement with the leaves its nodes span (consecutive nodes) and the cluster's spine oversubscription."""
    return dataclasses.replace(place, num_leaves=cluster.leaves_spanned(place.num_nodes),
                               spine_oversubscription=cluster.spine_oversubscription)


def predict_us(profile: ClusterProfile, collective: str, place: GroupPlacement,
               sizes_bytes: list[int]) -> list[float]:
    return [collective_time_s(collective, size, place, profile) * 1e6 for size in sizes_bytes]


def extrapolation_warnings(profile: ClusterProfile, place: GroupPlacement) -> list[str]:
    """Say when a prediction reaches far past what the profile was fitted on (or it was never measured)."""
    coverage = (profile.provenance or {}).get("coverage") or {}
    if not profile.measured or not coverage:
        return [f"profile {profile.name!r} is {profile.label}: these predictions are not from measurements"]
    warnings = []
    max_size, max_nodes = max(coverage["group_sizes"]), max(coverage["num_nodes"])
    if place.num_nodes > max_nodes:
        warnings.append(f"extrapolates to {place.num_nodes} nodes from fits on at most {max_nodes} node(s): "
                        f"the inter-node coefficients are {'derived from datasheets' if max_nodes == 1 else 'fitted'}, "
                        f"and the group structure (ring / tree) carries them to {place.size} GPUs")
    elif place.size > FAR_EXTRAPOLATION * max_size:
        warnings.append(f"extrapolates to {place.size} GPUs from fits on at most {max_size}")
    return warnings


def check_log(cluster: ClusterSpec, profile: ClusterProfile, log_path: str | Path,
              collective: str | None = None, *, allow_gpu_mismatch: bool = False) -> CheckResult:
    """Predicted vs measured time of every row of one nccl-tests log."""
    log = parse_nccl_tests(log_path, collective)
    log_warnings = check_log_for_cluster(log, cluster, allow_gpu_mismatch=allow_gpu_mismatch)
    place = on_fabric(log.placement(), cluster)
    if place.size < 2 and log.collective != "send_recv":
        raise CalibrationError(f"{log.path}: a 1-GPU log moves no data between GPUs; check against a log of 2 or "
                               f"more GPUs")
    rows = [row for row in log.rows if row.size_bytes > 0]
    predicted = predict_us(profile, log.collective, place, [row.size_bytes for row in rows])
    points = [CheckPoint(size_bytes=row.size_bytes, predicted_time_us=p, measured_time_us=row.time_us)
              for row, p in zip(rows, predicted)]
    return CheckResult(path=log.path, collective=log.collective, num_gpus=log.num_gpus, num_nodes=log.num_nodes,
                       ranks_per_node=place.ranks_per_node, points=points,
                       warnings=log_warnings + profile_warnings(profile, cluster) + extrapolation_warnings(profile, place))
