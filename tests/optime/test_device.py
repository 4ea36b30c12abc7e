"""The device rule (issue 20): op times serve only the same GPU model, memory size and form factor."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.cost.profile import default_profile
from echo_tune.errors import ConfigError
from echo_tune.sim.outputs.optime_coverage import check_op_times_device
from echo_tune.cost.optime.optime_db import Measurement, OpTimeDB, load_op_times
from echo_tune.cost.optime.optime_device import DeviceInfo, mismatch, serves

A100_40 = DeviceInfo(name="NVIDIA A100-SXM4-40GB", kind="cuda", torch_version="2.13.0", cuda_version="12.8")
KEY = '["aten.mm.default",[{"t":[4,8],"s":[8,1],"d":"bfloat16"},{"t":[8,2],"s":[2,1],"d":"bfloat16"}],{}]'
M = Measurement(time_s=1e-5, spread=0.1, repeats=5, warmup=3, method="cuda-events")


def test_memory_size_and_form_factor_must_match():
    assert serves("NVIDIA A100-SXM4-40GB", "cuda", "a100-40gb")
    assert not serves("NVIDIA A100-SXM4-40GB", "cuda", "a100-80gb")
    assert not serves("NVIDIA A100-SXM4-80GB", "cuda", "a100-40gb")
    assert mismatch("NVIDIA A100-SXM4-40GB", "cuda", "a100-80gb") == "the memory size differs: 40 GB against 80 GB"
    # the size in the device name against the cluster's memory when the GPU name has none
    assert serves("NVIDIA H100 80GB HBM3", "cuda", "h100-sxm", 85520809984)
    assert mismatch("NVIDIA A100-SXM4-40GB", "cuda", "a100", 85899345920) == \
        "the memory size differs: 40 GB against 80 GiB"
    assert mismatch("NVIDIA H100 PCIe", "cuda", "h100-sxm") == "the form factor differs: pcie against sxm"
    assert not serves("NVIDIA GB200", "cuda", "b200")
    assert serves("NVIDIA H200", "cuda", "h200-sxm", 150754820096)


def test_an_a100_40gb_database_does_not_serve_an_a100_80gb_cluster(tmp_path):
    with OpTimeDB(tmp_path / "db.sqlite") as db:
        db.add(A100_40, KEY, M)
    assert load_op_times(tmp_path / "db.sqlite", "a100-40gb").times == {KEY: 1e-5}
    with pytest.raises(ConfigError) as err:
        load_op_times(tmp_path / "db.sqlite", "a100-80gb")
    assert str(err.value) == (
        f"op-time database {str(tmp_path / 'db.sqlite')!r} was measured on 'NVIDIA A100-SXM4-40GB', not on this "
        f"cluster's GPU 'a100-80gb' (the memory size differs: 40 GB against 80 GB), and op times serve only the same "
        f"GPU model, memory size and form factor; run `echo-tune profile` on that GPU (a100-80gb) or remove "
        f"`op_times` from the profile")


def test_simulate_refuses_a_40gb_database_for_the_80gb_cluster(tmp_path):
    with OpTimeDB(tmp_path / "db.sqlite") as db:
        db.add(A100_40, KEY, M)
    cluster = et.load_cluster("a100-80gb")
    times = load_op_times(tmp_path / "db.sqlite", "a100-40gb")
    profile = dataclasses.replace(default_profile(cluster), op_times=times)
    with pytest.raises(ConfigError) as err:
        check_op_times_device(profile, cluster)
    assert "\n" not in str(err.value) and "'a100-80gb'" in str(err.value) \
        and "(the memory size differs: 40 GB against 80 GB)" in str(err.value)
    check_op_times_device(dataclasses.replace(default_profile(cluster), op_times=times), et.load_cluster("a100-40gb"))
