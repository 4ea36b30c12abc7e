"""Profile schema additions (protocol tiers, per-call latency, slowdown curves) and the comm model changes."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from echo_tune.calibrate.datasheet import datasheet_profile, shipped_profile_path
from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.config.load.loading import load_cluster, preset_names
from echo_tune.cost.collectives.comm import bus_factor, collective_time_s, ring_steps
from echo_tune.cost.profile import (LinkCoefficients, default_profile, load_profile, profile_for,
                                    profile_from_dict)
from echo_tune.errors import ConfigError

from .conftest import A100_DIR

INTRA = GroupPlacement(size=8, ranks_per_node=8, num_nodes=1)
CROSS = GroupPlacement(size=32, ranks_per_node=8, num_nodes=4)


def _profile(intra: LinkCoefficients, inter: LinkCoefficients | None = None):
    base = default_profile(load_cluster("a100-40gb"))
    comm = {"intra_node": {"default": intra}, "inter_node": {"default": inter or base.comm["inter_node"]["default"]}}
    return dataclasses.replace(base, comm=comm)


def test_single_tier_inside_a_node_is_the_plain_alpha_beta_model():
    link = LinkCoefficients(latency_s=2e-6, bus_bandwidth_gbyte_s=200)
    t = collective_time_s("all_reduce", 1 << 26, INTRA, _profile(link))
    assert t == pytest.approx(ring_steps("all_reduce", 8) * 2e-6 + bus_factor("all_reduce", 8) * (1 << 26) / 200e9)


def test_crossing_ring_pays_network_latency_on_network_steps_only():
    intra = LinkCoefficients(latency_s=1e-6, bus_bandwidth_gbyte_s=200, base_latency_s=5e-6)
    inter = LinkCoefficients(latency_s=10e-6, bus_bandwidth_gbyte_s=20, base_latency_s=5e-6)
    size = 1 << 30
    t = collective_time_s("all_gather", size, CROSS, _profile(intra, inter))
    expected = 5e-6 + (31 - 3) * 1e-6 + 3 * 10e-6 + bus_factor("all_gather", 32) * size / (min(200, 8 * 20) * 1e9)
    assert t == pytest.approx(expected)


def test_tiers_take_the_fastest_and_never_slow_down():
    simple = LinkCoefficients(latency_s=5e-6, bus_bandwidth_gbyte_s=200, base_latency_s=50e-6)
    tiered = dataclasses.replace(simple, protocols={"ll": {"latency_s": 1e-6, "bus_bandwidth_gbyte_s": 20}})
    for size in (1 << 10, 1 << 20, 1 << 30):
        plain = collective_time_s("all_reduce", size, INTRA, _profile(simple))
        fast = collective_time_s("all_reduce", size, INTRA, _profile(tiered))
        assert fast <= plain
    assert collective_time_s("all_reduce", 1 << 10, INTRA, _profile(tiered)) < 20e-6  # LL wins when small
    assert collective_time_s("all_reduce", 1 << 30, INTRA, _profile(tiered)) == \
        pytest.approx(collective_time_s("all_reduce", 1 << 30, INTRA, _profile(simple)))


def test_profile_round_trip_with_tiers_and_curves():
    link = LinkCoefficients(latency_s=1e-6, bus_bandwidth_gbyte_s=100, base_latency_s=3e-6,
                            protocols={"ll": LinkCoefficients(latency_s=5e-7, bus_bandwidth_gbyte_s=10)})
    profile = dataclasses.replace(_profile(link), slowdown_curves={"compute": {"amplitude": 0.1, "points": [[1, 1.1]]}})
    data = yaml.safe_load(yaml.safe_dump(profile.to_dict()))
    assert data["interference"]["slowdown_curves"]["compute"]["amplitude"] == 0.1
    assert data["comm"]["intra_node"]["default"]["protocols"]["ll"] == {"latency_s": 5e-7, "bus_bandwidth_gbyte_s": 10}
    assert profile_from_dict(data) == profile


def test_plain_profiles_keep_their_old_yaml():
    data = default_profile(load_cluster("h100-sxm")).to_dict()
    assert data["comm"]["intra_node"]["default"] == {"latency_s": 5e-6, "bus_bandwidth_gbyte_s": 360.0}
    assert "slowdown_curves" not in data["interference"]


def test_bad_tiers_are_one_line_config_errors():
    with pytest.raises(ConfigError, match=r"`base_latency_s >= 0` must hold, but got \(base_latency_s=-1\)"):
        LinkCoefficients(latency_s=0, bus_bandwidth_gbyte_s=1, base_latency_s=-1)
    tier = {"latency_s": 0, "bus_bandwidth_gbyte_s": 1}
    nested = {**tier, "protocols": {"a": tier}}
    with pytest.raises(ConfigError, match="must not nest"):
        LinkCoefficients(latency_s=0, bus_bandwidth_gbyte_s=1, protocols={"ll": nested})


@pytest.mark.parametrize("gpu", preset_names("gpus"))
def test_shipped_datasheet_profiles_are_current_and_labelled(gpu):
    shipped = load_profile(shipped_profile_path(gpu))
    assert shipped == datasheet_profile(gpu)  # regenerate: python -m echo_tune.calibrate.datasheet
    assert not shipped.measured and "NOT measured" in shipped.provenance["label"]
    assert shipped.provenance["sources"] and shipped.provenance["assumptions"]


def test_calibration_cluster_file_points_at_the_fitted_profile():
    profile = profile_for(load_cluster(A100_DIR / "cluster.yaml"))
    assert profile.measured and profile.name == "azure-ndv4-a100-40gb"
    assert profile.provenance["coverage"]["num_nodes"] == [1, 2]


def test_a_bandwidth_no_sample_binds_stays_inside_the_profiles_range():
    """Times that do not grow with the message (a CPU bench's latency-bound gloo calls can be all latency) leave the
    bus bandwidth unbound: the fit ends at the edge of what a profile accepts (limits.py), never past it, so the
    profile is written and validates (a gloo bench once fitted 99,992 GB/s and the profile was refused)."""
    import dataclasses

    from echo_tune.calibrate.fit.fit_comm import CommSample, fit_intra
    from echo_tune.config.load.loading import load_cluster
    from echo_tune.config.rules.compatibility import GroupPlacement
    from echo_tune.cost.profile import profile_for
    from echo_tune.limits import PROFILE_LIMITS

    base = profile_for(load_cluster("a100-40gb"))
    place = GroupPlacement(size=2, ranks_per_node=2, num_nodes=1)
    samples = [CommSample(collective="all_reduce", size_bytes=float(size), time_s=120e-6, place=place, source="flat")
               for size in (1 << 10, 1 << 14, 1 << 18, 1 << 22) for _ in range(2)]
    link, _ = fit_intra(samples, base)
    high = PROFILE_LIMITS["bus_bandwidth_gbyte_s"].high
    assert all(t.bus_bandwidth_gbyte_s <= high for t in link.tiers().values())
    comm = {scope: dict(table) for scope, table in base.comm.items()}
    comm["intra_node"]["all_reduce"] = link
    dataclasses.replace(base, comm=comm)  # validates (cost/profile_bounds.py) without a ConfigError
