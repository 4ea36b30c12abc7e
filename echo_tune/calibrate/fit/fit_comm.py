"""Fit the collective model of ``cost/collectives/comm.py`` to measured collective times.

The residuals are computed by ``collective_time_s`` itself, so the fitted coefficients mean exactly
what the simulator reads. Per collective:

* intra_node: 1 to 3 protocol tiers (NCCL's Simple, LL128, LL), each with a per-call latency, a
  per-ring-step latency and a bus bandwidth, fitted by least squares on log(predicted / measured)
  over every group size inside one node. The number of tiers is chosen by BIC.
* inter_node, with measurements of groups that span nodes: each tier's per-call latency, one NIC
  efficiency over the tiers' derived NIC shares and the tree efficiency (the two-node tree's
  NVLink-chain bandwidth relative to the NVLink ring's; past two nodes the network binds the tree
  and it is not read) are fitted with the intra-node tiers held fixed; the network hop latency
  too when two or more node counts are measured, else it stays NCCL's default (two nodes cannot
  tell it from the per-call latency).
* inter_node, without such measurements: derived. A tier's NIC bandwidth is the cluster's datasheet
  NIC rate per GPU times the efficiency the same tier reached on NVLink (fitted bus bandwidth /
  datasheet NVLink bandwidth): the protocol's overhead (flags, chunking) is the same on both links.
  Its network step latency is NCCL's own default (NCCL_NET_STEP_LATENCY_S), its per-call latency
  the intra-node one (NCCL's tuner has one base latency per protocol, whatever the fabric).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from echo_tune.calibrate.fit.results import FitResult, PointResidual
from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.collectives.nccl_tuning import NCCL_SOURCE, NET_RING_HOP_LATENCY_S
from echo_tune.cost.profile import ClusterProfile, LinkCoefficients
from echo_tune.limits import PROFILE_LIMITS

# Network per-hop latency of a ring by protocol, NCCL's default (cost/collectives/nccl_tuning.py).
NCCL_NET_STEP_LATENCY_S = NET_RING_HOP_LATENCY_S
TIER_NAMES = {1: ("simple",), 2: ("simple", "ll"), 3: ("simple", "ll128", "ll")}
_BW = PROFILE_LIMITS["bus_bandwidth_gbyte_s"]
_LOG_BOUNDS = {"base": (math.log(1e-9), math.log(1e-1)), "lat": (math.log(1e-10), math.log(1e-2)),
               # the range a profile accepts (limits.py), a hair inside: a bandwidth the samples do not bind (every
               # time latency, as a CPU bench's can be) ends at the edge and the profile is still written
               "bw": (math.log(_BW.low * (1 + 1e-9)), math.log(_BW.high * (1 - 1e-9))),
               "tree": (math.log(0.25), math.log(4.0)), "scale": (math.log(0.05), math.log(20.0))}


@dataclass(frozen=True, kw_only=True)
class CommSample:
    """One measured collective time."""

    collective: str
    size_bytes: float
    time_s: float
    place: GroupPlacement
    source: str

    @property
    def label(self) -> str:
        nodes = f" nodes={self.place.num_nodes}" if self.place.crosses_nodes else ""
        return f"n={self.place.size}{nodes} size={int(self.size_bytes)}"


def _with_links(profile: ClusterProfile, collective: str, intra: LinkCoefficients,
                inter: LinkCoefficients | None = None) -> ClusterProfile:
    comm = {scope: dict(table) for scope, table in profile.comm.items()}
    comm["intra_node"][collective] = intra
    if inter is not None:
        comm["inter_node"][collective] = inter
    return dataclasses.replace(profile, comm=comm)


def _predict_s(samples: list[CommSample], profile: ClusterProfile) -> np.ndarray:
    return np.array([collective_time_s(s.collective, s.size_bytes, s.place, profile) for s in samples])


def _link(tiers: list[tuple[float, float, float]], names: tuple[str, ...]) -> LinkCoefficients:
    """LinkCoefficients from (base_s, latency_s, bandwidth_gbyte_s) tiers, the first being "simple"."""
    made = [LinkCoefficients(base_latency_s=float(b), latency_s=float(l), bus_bandwidth_gbyte_s=float(w))
            for b, l, w in tiers]
    return dataclasses.replace(made[0], protocols=dict(zip(names[1:], made[1:])))


def _tiers_of(link: LinkCoefficients) -> list[tuple[str, LinkCoefficients]]:
    return list(link.tiers().items())


def _solve(residual_fn, starts: list[np.ndarray], lower: np.ndarray, upper: np.ndarray):
    """Least squares from several starts; the best solution."""
    best = None
    for x0 in starts:
        sol = least_squares(residual_fn, np.clip(x0, lower + 1e-9, upper - 1e-9), bounds=(lower, upper),
                            x_scale=1.0, max_nfev=400)
        if best is None or sol.cost < best.cost:
            best = sol
    return best


def _intra_starts(samples: list[CommSample], k: int) -> list[np.ndarray]:
    busbw = max(s.size_bytes / s.time_s for s in samples) / 1e9
    t_min = min(s.time_s for s in samples)
    starts = []
    for spread in (1.0, 0.5, 2.0):
        tiers = [(t_min * 0.5 * spread ** i, t_min * 0.05, busbw * 1.5 / (4 * spread) ** i) for i in range(k)]
        tiers[0] = (t_min * 2 * spread, t_min * 0.02, busbw * 1.5)
        starts.append(np.log(np.array(tiers)).ravel())
    return starts


def _fit_intra_tiers(samples: list[CommSample], base: ClusterProfile, k: int, free_base: bool):
    """Best k-tier intra-node link for these samples, and the least-squares cost."""
    collective, names = samples[0].collective, TIER_NAMES[k]
    measured = np.array([s.time_s for s in samples])

    def unpack(x: np.ndarray) -> LinkCoefficients:
        tiers = np.exp(x.reshape(k, 3))
        return _link([(b if free_base else 0.0, l, w) for b, l, w in tiers], names)

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(_predict_s(samples, _with_links(base, collective, unpack(x))) / measured)

    lower = np.tile([_LOG_BOUNDS[p][0] for p in ("base", "lat", "bw")], k)
    upper = np.tile([_LOG_BOUNDS[p][1] for p in ("base", "lat", "bw")], k)
    sol = _solve(residual, _intra_starts(samples, k), lower, upper)
    return _sorted_link(unpack(sol.x)), 2 * sol.cost


def _sorted_link(link: LinkCoefficients) -> LinkCoefficients:
    """Tiers renamed by bandwidth: the fastest is "simple", then "ll128", then "ll"."""
    tiers = sorted((t for _, t in _tiers_of(link)), key=lambda t: -t.bus_bandwidth_gbyte_s)
    return _link([(t.base_latency_s, t.latency_s, t.bus_bandwidth_gbyte_s) for t in tiers], TIER_NAMES[len(tiers)])


def _winning_tiers(samples: list[CommSample], base: ClusterProfile, intra: LinkCoefficients,
                   inter: LinkCoefficients | None = None) -> set[str]:
    """Names of the tiers that give the minimum for at least one sample."""
    collective = samples[0].collective
    inter_tiers = dict(_tiers_of(inter)) if inter is not None else {}
    times = {}
    for name, tier in _tiers_of(intra):
        if inter is not None and name not in inter_tiers:
            continue
        solo_inter = dataclasses.replace(inter_tiers[name], protocols={}) if inter is not None else None
        times[name] = _predict_s(samples, _with_links(base, collective, dataclasses.replace(tier, protocols={}),
                                                      solo_inter))
    stacked = np.array(list(times.values()))
    return {list(times)[i] for i in set(np.argmin(stacked, axis=0).tolist())}


def _keep_tiers(link: LinkCoefficients, names: set[str]) -> LinkCoefficients:
    return dataclasses.replace(link, protocols={n: t for n, t in link.protocols.items() if n in names})


def _points(samples: list[CommSample], predicted: np.ndarray, quantity: str) -> list[PointResidual]:
    return [PointResidual(quantity=quantity, source=s.source, label=s.label, measured=s.time_s * 1e6,
                          predicted=float(p) * 1e6, unit="us") for s, p in zip(samples, predicted)]


def _params(link: LinkCoefficients) -> dict:
    return {name: {"base_latency_us": round(t.base_latency_s * 1e6, 3), "step_latency_us": round(t.latency_s * 1e6, 3),
                   "bus_bandwidth_gbyte_s": round(t.bus_bandwidth_gbyte_s, 2),
                   **({"tree_efficiency": round(t.tree_efficiency, 3)} if t.tree_efficiency != 1.0 else {})}
            for name, t in _tiers_of(link)}


def fit_intra(samples: list[CommSample], base: ClusterProfile,
              max_tiers: int | None = None) -> tuple[LinkCoefficients, FitResult]:
    """Fit the intra-node link of one collective (tiers chosen by BIC up to ``max_tiers``)."""
    collective = samples[0].collective
    sizes = {s.place.size for s in samples}
    free_base = len(sizes) > 1 and collective != "send_recv"
    limit = max(1, min(max_tiers or 3, 3, len(samples) // 8))
    best = None
    for k in range(1, limit + 1):
        link, rss = _fit_intra_tiers(samples, base, k, free_base)
        bic = len(samples) * math.log(max(rss, 1e-300) / len(samples)) + 3 * k * math.log(len(samples))
        if best is None or bic < best[0] - 1e-9:
            best = (bic, link)
    link = _keep_tiers(best[1], _winning_tiers(samples, base, best[1]))
    quantity = f"{collective} intra_node"
    result = FitResult(quantity=quantity, method="least squares", params=_params(link),
                       points=_points(samples, _predict_s(samples, _with_links(base, collective, link)), quantity))
    if not free_base and collective != "send_recv":
        result.warnings.append(f"{quantity}: one group size only (n={sizes.pop()}): per-call and per-step latency "
                               f"cannot be separated, so all of it is put per ring step")
    result.flag_poor_fit()
    return link, result


def derive_inter(intra: LinkCoefficients, cluster: ClusterSpec, collective: str) -> tuple[LinkCoefficients, FitResult]:
    """Inter-node link from the datasheet NIC rate times each tier's NVLink protocol efficiency."""
    tiers, notes = [], []
    for name, tier in _tiers_of(intra):
        efficiency = tier.bus_bandwidth_gbyte_s / cluster.intra_node_bandwidth_gbyte_s
        if efficiency > 1:
            notes.append(f"{name}: fitted bus bandwidth exceeds the datasheet NVLink rate; efficiency capped at 1")
            efficiency = 1.0
        notes.append(f"{name}: NIC {cluster.inter_node_bandwidth_per_gpu_gbyte_s:.4g} GB/s per GPU x NVLink "
                     f"efficiency {efficiency:.3f}; network step latency {NCCL_NET_STEP_LATENCY_S[name] * 1e6:.1f} us "
                     f"(NCCL default)")
        tiers.append((tier.base_latency_s, NCCL_NET_STEP_LATENCY_S[name],
                      cluster.inter_node_bandwidth_per_gpu_gbyte_s * efficiency))
    link = _link(tiers, tuple(n for n, _ in _tiers_of(intra)))
    result = FitResult(quantity=f"{collective} inter_node", method="derived", params=_params(link), notes=notes)
    result.warnings.append(f"{collective} inter_node: no measurement across nodes; derived from the datasheet NIC "
                           f"rate and the NVLink fit (not measured) - check it with a 2-node log")
    return link, result


def fit_inter(samples: list[CommSample], intra: LinkCoefficients, cluster: ClusterSpec,
              base: ClusterProfile) -> tuple[LinkCoefficients, FitResult]:
    """Fit the network terms of every tier, intra-node tiers held fixed: each tier's per-call latency,
    one NIC efficiency (every tier's NIC share keeps its NVLink protocol efficiency relative to the
    others, as NCCL's protocol factors are the same on both links) and one tree efficiency.

    The network hop latency is fitted too when the samples cover two or more node counts; with one
    node count (two nodes) it cannot be told from the per-call latency (every crossing ring and tree
    has the same number of network hops), so it is held at NCCL's default for the protocol.
    """
    collective = samples[0].collective
    start, _ = derive_inter(intra, cluster, collective)
    names = tuple(n for n, _ in _tiers_of(start))
    derived = [t for _, t in _tiers_of(start)]
    k = len(names)
    free_hop = len({s.place.num_nodes for s in samples}) > 1
    measured = np.array([s.time_s for s in samples])

    def unpack(x: np.ndarray) -> LinkCoefficients:
        scale, tree = math.exp(x[0]), math.exp(x[1])
        bases = np.exp(x[2:2 + k])
        hops = np.exp(x[2 + k:]) if free_hop else [t.latency_s for t in derived]
        tiers = [LinkCoefficients(base_latency_s=float(b), bus_bandwidth_gbyte_s=t.bus_bandwidth_gbyte_s * scale,
                                  tree_efficiency=tree, latency_s=float(h))
                 for t, b, h in zip(derived, bases, hops)]
        return dataclasses.replace(tiers[0], protocols=dict(zip(names[1:], tiers[1:])))

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(_predict_s(samples, _with_links(base, collective, intra, unpack(x))) / measured)

    x0 = np.log(np.array([1.0, 1.0] + [max(t.base_latency_s, 1e-7) for t in derived]
                         + ([t.latency_s for t in derived] if free_hop else [])))
    keys = ["scale", "tree"] + ["base"] * k + (["lat"] * k if free_hop else [])
    lower = np.array([_LOG_BOUNDS[key][0] for key in keys])
    upper = np.array([_LOG_BOUNDS[key][1] for key in keys])
    link = unpack(_solve(residual, [x0, x0 + math.log(2.0), x0 - math.log(2.0)], lower, upper).x)
    link = _keep_tiers(link, _winning_tiers(samples, base, intra, link))
    quantity = f"{collective} inter_node"
    predicted = _predict_s(samples, _with_links(base, collective, intra, link))
    notes = ["intra-node tiers held at their own fit"]
    if not free_hop:
        notes.append("one node count measured: network hop latency held at NCCL's default per protocol "
                     f"({NCCL_SOURCE}: ring hwLat NET LL 2.7, LL128 4.0, Simple 14.0 us)")
    result = FitResult(quantity=quantity, method="least squares", params=_params(link),
                       points=_points(samples, predicted, quantity), notes=notes)
    per_node = {s.place.ranks_per_node for s in samples}
    if link.bus_bandwidth_gbyte_s * min(per_node) >= intra.bus_bandwidth_gbyte_s:
        result.warnings.append(f"{quantity}: the crossing rings measured are bound by the intra-node bandwidth, "
                               f"so the NIC bandwidth is only a lower bound")
    result.flag_poor_fit()
    return link, result
