"""Latency-bandwidth coefficients of one collective in one scope, a part of a calibration profile
(``cost/profile.py``, which imports it from here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from echo_tune.config._checks import require, require_positive


@dataclass(frozen=True, kw_only=True)
class LinkCoefficients:
    """Latency-bandwidth coefficients of one collective in one scope."""

    latency_s: float
    """Fixed cost of one algorithm step (alpha)."""
    bus_bandwidth_gbyte_s: float
    """Large-message bus bandwidth in nccl-tests' busbw convention (inter_node: per GPU's NIC share)."""
    base_latency_s: float = 0.0
    """Fixed cost of one call (launch, protocol setup), paid once whatever the group size."""
    tree_efficiency: float = 1.0
    """inter_node only: bandwidth of a two-node tree all-reduce's NVLink chain relative to the NVLink ring
    (1 = NCCL's own tree/ring ratio and treeCorrectionFactor hold; fitted from two-node measurements;
    past two nodes the network binds the tree and this is not read, see cost/collectives/comm.py)."""
    protocols: dict[str, "LinkCoefficients"] = field(default_factory=dict, hash=False)
    """Extra protocol tiers (NCCL's LL, LL128) with their own coefficients; the fields above are the
    large-message (Simple) tier. A collective takes its fastest tier, as NCCL's tuner picks the
    fastest protocol (src/graph/tuning.cc)."""

    def __post_init__(self) -> None:
        for name in ("latency_s", "base_latency_s"):
            value = getattr(self, name)
            require(value >= 0, f"`{name} >= 0` must hold, but got ({name}={value})")
        require_positive("bus_bandwidth_gbyte_s", self.bus_bandwidth_gbyte_s)
        require_positive("tree_efficiency", self.tree_efficiency)
        tiers = {str(k): v if isinstance(v, LinkCoefficients) else LinkCoefficients(**v)
                 for k, v in (self.protocols or {}).items()}
        require(all(not t.protocols for t in tiers.values()),
                "protocol tiers must not nest: a tier under `protocols` has no `protocols` of its own")
        object.__setattr__(self, "protocols", tiers)
        object.__setattr__(self, "_tiers", {"simple": self, **tiers})  # built once: collective time is a hot path

    def tiers(self) -> dict[str, "LinkCoefficients"]:
        """All protocol tiers by name, the large-message tier as "simple" (do not modify the mapping)."""
        return self._tiers

    def to_dict(self) -> dict:
        """YAML mapping; the optional keys only when they differ from their defaults."""
        data = {"latency_s": self.latency_s, "bus_bandwidth_gbyte_s": self.bus_bandwidth_gbyte_s}
        if self.base_latency_s:
            data["base_latency_s"] = self.base_latency_s
        if self.tree_efficiency != 1.0:
            data["tree_efficiency"] = self.tree_efficiency
        if self.protocols:
            data["protocols"] = {name: tier.to_dict() for name, tier in self.protocols.items()}
        return data
