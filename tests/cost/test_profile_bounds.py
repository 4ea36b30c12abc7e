"""Physical bounds of a calibration profile's numbers (issue 41): a profile file with a bandwidth of 1e300, a
latency of .inf or an efficiency above 1 is refused in one line naming the file, the key as written in the file,
the rule and the fix (it used to simulate silently to a throughput of 0); a fitted sustained clock is named as the
profile's key, not as ``gpu.sustained_clock_mhz``."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.config.load.loading import load_cluster
from echo_tune.cost.collectives.link_coefficients import LinkCoefficients
from echo_tune.config.load.loading import preset_names
from echo_tune.cost.profile import ClusterProfile, default_profile, load_profile, save_profile
from echo_tune.cost.profile_bounds import check_profile_numbers
from echo_tune.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
BASE = yaml.safe_load((REPO / "echo_tune" / "calibrate" / "profiles" / "a100-80gb.yaml").read_text())
SIM = ["simulate", "--cluster", "a100-80gb", "--model", "gpt-1.7b", "--num-gpus", "16", "--global-batch-size", "64",
       "--tensor-model-parallel-size", "8"]
INF = float("inf")


def _set(data: dict, dotted: str, value) -> dict:
    data = copy.deepcopy(data)
    *parents, last = dotted.split(".")
    table = data
    for key in parents:
        table = table.setdefault(key, {})
    table[last] = value
    return data


def _mapping(data) -> dict:
    return data if isinstance(data, dict) else {}


def _write(tmp_path, data: dict) -> str:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


LINK = "comm.inter_node.default"
CASES = [  # (dotted key, value, the rule as printed)
    (f"{LINK}.bus_bandwidth_gbyte_s", 1e300, "`0.001 <= comm.inter_node.default.bus_bandwidth_gbyte_s <= 10000`"),
    ("compute.memory_bandwidth_gbyte_s", 1e300, "`0.1 <= compute.memory_bandwidth_gbyte_s <= 100000`"),
    (f"{LINK}.latency_s", INF, "`comm.inter_node.default.latency_s` must be finite"),
    (f"{LINK}.latency_s", 5.0, "`0 <= comm.inter_node.default.latency_s <= 1`"),
    (f"{LINK}.base_latency_s", 1e9, "`0 <= comm.inter_node.default.base_latency_s <= 1`"),
    (f"{LINK}.tree_efficiency", 0, "`0 < comm.inter_node.default.tree_efficiency <= 4`"),
    ("comm.intra_node.default.bus_bandwidth_gbyte_s", 1e-9, "`0.001 <= comm.intra_node.default.bus_bandwidth_gbyte_s"),
    ("comm.intra_node.all_reduce", {"latency_s": 1e-6, "bus_bandwidth_gbyte_s": 100,
                                    "protocols": {"ll": {"latency_s": 1e-6, "bus_bandwidth_gbyte_s": 1e300}}},
     "`0.001 <= comm.intra_node.all_reduce.protocols.ll.bus_bandwidth_gbyte_s <= 10000`"),
    ("compute.gemm_max_efficiency", 1.5, "`0 < compute.gemm_max_efficiency <= 1`"),
    ("compute.fp8_gemm_max_efficiency", 0, "`0 < compute.fp8_gemm_max_efficiency <= 1`"),
    ("compute.attention_efficiency", 2, "`0 < compute.attention_efficiency <= 1`"),
    ("compute.attention_backward_efficiency", 1.01, "`0 < compute.attention_backward_efficiency <= 1`"),
    ("compute.attention_causal_factor", 3, "`0 < compute.attention_causal_factor <= 1`"),
    ("compute.gemm_half_saturation_dim", 1e30, "`1 <= compute.gemm_half_saturation_dim <= 1.04858e+06`"),
    ("compute.kernel_launch_overhead_s", INF, "`compute.kernel_launch_overhead_s` must be finite"),
    ("interference.compute_slowdown", 1e6, "`1 <= interference.compute_slowdown <= 100`"),
    ("interference.slowdown_curves", {"comm": {"amplitude": 1e300, "half_size_bytes": 1e6}},
     "`0 <= interference.slowdown_curves.comm.amplitude <= 99`"),
    ("fitted.params.host_time_per_kernel_s", 1.0, "`0 <= fitted.params.host_time_per_kernel_s <= 0.01`"),
    ("fitted.params.comm_time_factor", 1e6, "`0.01 <= fitted.params.comm_time_factor <= 100`"),
    ("fitted.params.kernel_launch_overhead_s", -1, "`0 <= fitted.params.kernel_launch_overhead_s <= 0.01`"),
    (f"{LINK}.bus_bandwidth_gbyte_s", "fast", "`comm.inter_node.default.bus_bandwidth_gbyte_s` must be a number"),
]


@pytest.mark.parametrize("dotted,value,rule", CASES, ids=[f"{c[0]}={c[1]!r}"[:60] for c in CASES])
def test_an_out_of_range_number_is_refused_by_its_key_in_the_file(tmp_path, capsys, dotted, value, rule):
    path = _write(tmp_path, _set(BASE, dotted, value))
    line = _refused(capsys, [*SIM, "--profile", path])
    assert f"profile {path!r}: {rule}" in line, line
    with pytest.raises(ConfigError, match="must"):
        load_profile(path)


def test_the_issue_profile_no_longer_simulates_to_zero_throughput(tmp_path, capsys):
    data = _set(_set(BASE, f"{LINK}.latency_s", INF), "compute.memory_bandwidth_gbyte_s", 1e300)
    line = _refused(capsys, [*SIM, "--profile", _write(tmp_path, data)])
    assert "compute.memory_bandwidth_gbyte_s" in line and "give a value in range" in line


def test_every_shipped_profile_is_within_the_bounds():
    folders = ("echo_tune", "calibration", "benchmarks", "tests")
    shipped = [p for folder in folders for p in (REPO / folder).rglob("*.yaml")]
    profiles = [p for p in shipped if {"compute", "comm"} <= set(_mapping(yaml.safe_load(p.read_text())))]
    assert len(profiles) >= 13
    for path in profiles:
        load_profile(path)
    for cluster in preset_names("clusters"):
        check_profile_numbers(default_profile(load_cluster(cluster)).to_dict(), cluster)


@pytest.mark.parametrize("clock,fragments", [
    (50000, ["`100 <= fitted.params.sustained_clock_mhz <= 6000`", "(fitted.params.sustained_clock_mhz=50000)"]),
    (1.3, ["looks like GHz: give 1300 (MHz)"]),
    (1900, ["`fitted.params.sustained_clock_mhz <= 1.1 x peak_clock_mhz`", "peak_clock_mhz=1410 on a100-80gb",
            "drop fitted.params.sustained_clock_mhz"]),
])
def test_a_fitted_clock_is_named_as_the_profiles_key(tmp_path, capsys, clock, fragments):
    path = _write(tmp_path, _set(BASE, "fitted.params.sustained_clock_mhz", clock))
    line = _refused(capsys, [*SIM, "--profile", path])
    assert line.startswith(f"echo-tune simulate: error: profile {path!r}: ") and "gpu.sustained_clock_mhz" not in line
    for fragment in fragments:
        assert fragment in line, line


def test_a_fitted_clock_is_checked_against_the_gpu_it_runs_on(tmp_path, capsys):
    """A profile of a GPU that is no preset reads; the clock is held to the cluster's GPU where it is used."""
    data = _set(_set(BASE, "gpu", "my-a100"), "fitted.params.sustained_clock_mhz", 1900)
    path = _write(tmp_path, data)
    assert load_profile(path).fitted_clock_mhz == 1900
    line = _refused(capsys, [*SIM, "--profile", path])
    assert "profile 'a100-80gb-datasheet': `fitted.params.sustained_clock_mhz <= 1.1 x peak_clock_mhz`" in line
    assert main([*SIM, "--profile", path, "--gpu-clock-mhz", "1300", "--json"]) == 0  # the cluster's clock wins
    capsys.readouterr()


def test_a_fit_out_of_range_is_not_written(tmp_path):
    profile = default_profile(load_cluster("a100-80gb"))
    wild = LinkCoefficients(latency_s=1e-5, bus_bandwidth_gbyte_s=1e300)
    bad = dataclasses.replace(profile, comm={**profile.comm, "inter_node": {"default": wild}})
    target = tmp_path / "fit.yaml"
    with pytest.raises(ConfigError, match=r"profile 'a100-80gb-datasheet' \(not written\): `0.001 <= "
                                          r"comm.inter_node.default.bus_bandwidth_gbyte_s <= 10000` must hold"):
        save_profile(bad, target)
    assert not target.exists()
    save_profile(profile, target)
    assert load_profile(target) == profile


def test_fitted_parameters_of_a_built_profile_are_bounded():
    profile = default_profile(load_cluster("a100-80gb"))
    with pytest.raises(ConfigError, match=r"`0.01 <= fitted.params.comm_time_factor <= 100` must hold"):
        dataclasses.replace(profile, fitted={"params": {"comm_time_factor": 1e6}})
    with pytest.raises(ConfigError, match=r"`0 <= fitted.params.host_time_per_kernel_s <= 0.01`"):
        ClusterProfile(**{**{f.name: getattr(profile, f.name) for f in dataclasses.fields(profile)},
                          "fitted": {"params": {"host_time_per_kernel_s": 2.0}}})
    assert dataclasses.replace(profile, fitted={"params": {"host_time_per_kernel_s": 0}}).host_time_per_kernel_s == 0
