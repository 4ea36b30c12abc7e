"""Fit on the real A100 nccl-tests logs; the acceptance check: 1-node fit predicts the 2-node log."""

from __future__ import annotations

import pytest

from echo_tune.calibrate.fit.check import check_log, placement_for, predict_us
from echo_tune.calibrate.fit.fit_comm import NCCL_NET_STEP_LATENCY_S
from echo_tune.cost.collectives.comm import bus_factor
from echo_tune.cost.profile import load_profile

from .conftest import A100_DIR, LOGS

MIB = 1 << 20


def test_one_node_fit_predicts_two_nodes_within_25_percent(one_node_fit, a100_cluster):
    # Derived (not measured) network terms: NCCL 2.30.7's default network hops overrate two nodes'
    # latency at 1-2 MiB (+21 %, +10 %); 4-8 MiB within 10 % (the two-node tree, NVLink-bound);
    # large messages within 15 % (NCCL's tuner runs them as rings).
    result = check_log(a100_cluster, one_node_fit.profile, LOGS[16])
    big = [p for p in result.points if p.size_bytes >= MIB]
    assert len(big) == 15
    errors = {p.size_bytes: round(p.relative_error, 3) for p in big}
    assert all(abs(e) <= 0.25 for e in errors.values()), errors
    assert all(abs(e) <= 0.10 for size, e in errors.items() if 4 * MIB <= size <= 8 * MIB), errors
    assert all(abs(e) <= 0.15 for size, e in errors.items() if size >= 16 * MIB), errors
    assert result.warnings and "extrapolates to 2 nodes" in result.warnings[0]


def test_one_node_fit_takes_nothing_from_the_16gpu_log(one_node_fit, a100_cluster):
    profile = one_node_fit.profile
    paths = [s["path"] for s in profile.provenance["sources"]]
    assert not any("16gpu" in p for p in paths)
    inter, intra = profile.link("inter_node", "all_reduce"), profile.link("intra_node", "all_reduce")
    # Inter-node: the datasheet NIC share times the NVLink efficiency of the same protocol tier,
    # NCCL's default network step latency, the intra-node per-call latency.
    nic = a100_cluster.inter_node_bandwidth_per_gpu_gbyte_s
    for name, tier in inter.tiers().items():
        efficiency = intra.tiers()[name].bus_bandwidth_gbyte_s / a100_cluster.intra_node_bandwidth_gbyte_s
        assert tier.bus_bandwidth_gbyte_s == pytest.approx(nic * efficiency, rel=1e-3)
        assert tier.latency_s == pytest.approx(NCCL_NET_STEP_LATENCY_S[name])
        assert tier.base_latency_s == pytest.approx(intra.tiers()[name].base_latency_s, rel=1e-3)


def test_intra_node_fit_quality(one_node_fit):
    intra = next(r for r in one_node_fit.results if r.quantity == "all_reduce intra_node")
    assert len(intra.points) == 84 and intra.method == "least squares"
    assert intra.rms_relative_error < 0.12
    large = [p for p in intra.points if int(p.label.split("size=")[1]) >= MIB]
    assert max(abs(p.relative_error) for p in large) < 0.15
    simple = one_node_fit.profile.link("intra_node", "all_reduce")
    assert 200 < simple.bus_bandwidth_gbyte_s < 240  # 8-GPU busbw saturates at 231 GB/s


def test_memory_bandwidth_from_the_single_gpu_copy(one_node_fit):
    bandwidth = one_node_fit.profile.memory_bandwidth_gbyte_s
    assert 0.8 * 1555 < bandwidth < 0.92 * 1555  # 1 GiB copied in 1620 us: 1325 GB/s of HBM traffic


def test_all_logs_fit_and_16_node_extrapolation(two_node_fit, a100_cluster):
    profile = two_node_fit.profile
    inter = next(r for r in two_node_fit.results if r.quantity == "all_reduce inter_node")
    assert inter.method == "least squares" and len(inter.points) == 25 and inter.max_relative_error < 0.20
    assert max(abs(p.relative_error) for p in inter.points if int(p.label.split("size=")[1]) >= MIB) < 0.12
    sizes = [1 << p for p in range(20, 35, 2)]
    two = predict_us(profile, "all_reduce", placement_for(a100_cluster, 16), sizes)
    sixteen = predict_us(profile, "all_reduce", placement_for(a100_cluster, 128), sizes)
    assert all(t16 >= t2 for t16, t2 in zip(sixteen, two))  # more nodes is never faster
    busbw = bus_factor("all_reduce", 128) * sizes[-1] / (sixteen[-1] * 1e-6) / 1e9
    assert 110 < busbw < 135  # still NIC-bound: 8 rings x one NIC share each
    assert sixteen[0] < 2 * two[0]  # 1 MiB: the tree keeps latency logarithmic in nodes


def test_shipped_profiles_match_a_fresh_fit(one_node_fit, two_node_fit, a100_cluster):
    for name, outcome in (("profile-1node.yaml", one_node_fit), ("profile.yaml", two_node_fit)):
        shipped = load_profile(A100_DIR / name)
        assert shipped.measured
        for size in (MIB, 64 * MIB, 1 << 30):
            for n in (8, 16, 128):
                place = placement_for(a100_cluster, n)
                fresh = predict_us(outcome.profile, "all_reduce", place, [size])[0]
                assert predict_us(shipped, "all_reduce", place, [size])[0] == pytest.approx(fresh, rel=0.01)


def test_shipped_one_node_profile_passes_the_check(a100_cluster):
    result = check_log(a100_cluster, load_profile(A100_DIR / "profile-1node.yaml"), LOGS[16])
    assert result.max_abs_error(MIB) <= 0.35
