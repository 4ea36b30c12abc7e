"""Physical bounds of every number a calibration profile holds (issue 41).

A profile file's efficiencies, bandwidths, latencies, slowdowns and fitted parameters are read as given; one
of ``1e300`` GB/s or ``.inf`` seconds simulated silently to a throughput of 0. ``check_profile_numbers``
checks each against ``echo_tune.limits.PROFILE_LIMITS`` and names the first one out of range by its key in
the file (``comm.inter_node.default.latency_s``), with the file, the rule and the fix, in one line. A
fitted ``sustained_clock_mhz`` is also held to its GPU's boost clock (``config.cluster.check_clock``), named
as the profile's key, not as the GPU's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from echo_tune.config.specs.cluster import check_clock
from echo_tune.config.load.loading import load_gpu, preset_names
from echo_tune.errors import ConfigError
from echo_tune.limits import PROFILE_LIMITS, check_number

if TYPE_CHECKING:
    from echo_tune.config.specs.cluster import ClusterSpec, GPUSpec

LINK_KEYS = ("latency_s", "base_latency_s", "bus_bandwidth_gbyte_s", "tree_efficiency")
CURVE_KEYS = ("amplitude", "half_size_bytes", "median")
FITTED_KEYS = ("sustained_clock_mhz", "comm_time_factor", "host_time_per_kernel_s", "kernel_launch_overhead_s")
CLOCK_KEY = "fitted.params.sustained_clock_mhz"


def _check(where: str, key: str, value: object, dotted: str) -> None:
    try:
        check_number(key, value, PROFILE_LIMITS[key], flag=dotted)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _mapping(value: object) -> dict:
    """``value`` when it is a mapping, else {} (a wrong shape is the profile constructor's to name)."""
    return value if isinstance(value, dict) else {}


def _check_link(where: str, coeffs: object, path: str) -> None:
    coeffs = _mapping(coeffs)
    for key in LINK_KEYS:
        if key in coeffs:
            _check(where, key, coeffs[key], f"{path}.{key}")
    for tier, tier_coeffs in _mapping(coeffs.get("protocols")).items():
        _check_link(where, tier_coeffs, f"{path}.protocols.{tier}")


def check_profile_numbers(data: dict, where: str) -> None:
    """Every number of a profile mapping (the file's layout) within ``PROFILE_LIMITS``: a one-line ConfigError
    naming the first one that is not, by its dotted key. A fitted clock is checked against the GPU preset the
    profile names, when it names one."""
    for section in ("compute", "interference"):
        for key, value in _mapping(data.get(section)).items():
            if key in PROFILE_LIMITS and not (value is None and key == "attention_backward_efficiency"):
                _check(where, key, value, f"{section}.{key}")
    for name, curve in _mapping(_mapping(data.get("interference")).get("slowdown_curves")).items():
        for key in CURVE_KEYS:
            if key in _mapping(curve):
                _check(where, key, curve[key], f"interference.slowdown_curves.{name}.{key}")
    for scope, table in _mapping(data.get("comm")).items():
        for collective, coeffs in _mapping(table).items():
            _check_link(where, coeffs, f"comm.{scope}.{collective}")
    params = _mapping(_mapping(data.get("fitted")).get("params"))
    for key in FITTED_KEYS:
        if params.get(key) is not None:
            _check(where, key, params[key], f"fitted.params.{key}")
    clock, gpu = params.get("sustained_clock_mhz"), _preset_gpu(data.get("gpu"))
    if clock is not None and gpu is not None:
        check_fitted_clock(where, clock, gpu)


def _preset_gpu(name: object) -> GPUSpec | None:
    return load_gpu(name) if isinstance(name, str) and name in preset_names("gpus") else None


def check_fitted_clock(where: str, clock: float, gpu: GPUSpec) -> None:
    """A profile's fitted ``sustained_clock_mhz`` within any GPU's range and at most ``gpu``'s boost clock."""
    try:
        check_clock(gpu, clock, CLOCK_KEY)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}; or refit the clock (`calibrate fit --runs`), or drop {CLOCK_KEY} "
                          f"from the profile") from None


def check_clock_in_use(profile_name: str, fitted_clock: float | None, cluster: ClusterSpec) -> None:
    """The fitted clock a simulation of ``cluster`` takes (the cluster gives none of its own) against its GPU."""
    if fitted_clock is not None and cluster.sustained_clock_mhz is None:
        check_fitted_clock(f"profile {profile_name!r}", fitted_clock, cluster.gpu)
