"""The op-time database: its keys, refusal of a foreign device, and resume after an interruption."""

import sqlite3

import pytest

import echo_tune as et
from echo_tune.errors import ConfigError
from echo_tune.optime.collect import distinct_ops
from echo_tune.cost.optime.optime_db import Measurement, OpTimeDB, load_op_times
from echo_tune.cost.optime.optime_device import DeviceInfo, local_device, serves
from echo_tune.optime.measure import measure_key
from echo_tune.optime.profiler import profile_layouts

from .conftest import CLUSTER, MODEL, tiny_layout

H100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", kind="cuda", torch_version="2.13.0", cuda_version="12.8")
CPU = DeviceInfo(name="cpu: test (1 threads)", kind="cpu", torch_version="2.13.0", cuda_version="none")
KEY = '["aten.mm.default",[{"t":[4,8],"s":[8,1],"d":"bfloat16"},{"t":[8,2],"s":[2,1],"d":"bfloat16"}],{}]'
M = Measurement(time_s=1e-5, spread=0.1, repeats=5, warmup=3, method="cuda-events")


def test_rows_are_keyed_by_device_versions_and_op(tmp_path):
    with OpTimeDB(tmp_path / "db.sqlite") as db:
        db.add(H100, KEY, M)
        db.add(CPU, KEY, Measurement(time_s=2e-3, spread=0.1, repeats=5, warmup=3, method="thread-cpu-time"))
        db.add(H100, KEY, Measurement(time_s=3e-5, spread=0.1, repeats=5, warmup=3, method="cuda-events"))
        newer_torch = DeviceInfo(name=H100.name, kind="cuda", torch_version="2.14.0", cuda_version="12.8")
        assert db.known_keys(H100) == {KEY} and db.known_keys(newer_torch) == set()
    rows = sqlite3.connect(tmp_path / "db.sqlite").execute(
        "SELECT device, torch_version, cuda_version, op, shapes, dtype, time_s, method, host, measured_at "
        "FROM op_times ORDER BY device").fetchall()
    assert len(rows) == 2  # the second H100 measurement replaced the first
    h100 = [r for r in rows if r[0] == H100.name][0]
    assert h100[1:7] == ("2.13.0", "12.8", "aten.mm.default", "4x8;8x2", "bfloat16", 3e-5)
    assert h100[7] == "cuda-events" and h100[8] and h100[9]
    assert load_op_times(tmp_path / "db.sqlite", "h100-sxm").times == {KEY: 3e-5}
    assert load_op_times(tmp_path / "db.sqlite", "cpu-test").times == {KEY: 2e-3}


def test_device_rule():
    assert serves("NVIDIA H100 80GB HBM3", "cuda", "h100-sxm")
    assert serves("NVIDIA A100-SXM4-80GB", "cuda", "a100-80gb")
    assert not serves("NVIDIA H100 80GB HBM3", "cuda", "a100-80gb")
    assert not serves("cpu: AMD EPYC (1 threads)", "cpu", "h100-sxm")
    assert serves("cpu: AMD EPYC (1 threads)", "cpu", "cpu-test")
    assert not serves("NVIDIA H100 80GB HBM3", "cuda", "cpu-test")


def test_foreign_device_is_refused_in_one_line(tmp_path):
    with OpTimeDB(tmp_path / "db.sqlite") as db:
        db.add(CPU, KEY, M)
    with pytest.raises(ConfigError) as err:
        load_op_times(tmp_path / "db.sqlite", "h100-sxm")
    assert "\n" not in str(err.value) and "cpu: test (1 threads)" in str(err.value) and "h100-sxm" in str(err.value)


def test_simulate_refuses_a_cpu_database_for_a_gpu_cluster(profiled):
    model, _cluster, layout, profile = profiled
    with pytest.raises(ConfigError) as err:
        et.simulate(model, et.load_cluster("h100-sxm"), 4, layout, profile=profile)
    assert "\n" not in str(err.value) and "measured on" in str(err.value) and "h100-sxm" in str(err.value)


def test_interrupted_profile_keeps_its_rows_and_resumes(tmp_path, one_thread):
    model, cluster = et.load_model(str(MODEL)), et.load_cluster(str(CLUSTER))
    layouts = [tiny_layout(), tiny_layout(micro_batch_size=2)]
    keys = {op.key for op in distinct_ops(model, cluster, 4, layouts)}
    device, info = local_device("cpu")

    def interrupt_after_five(i, n, op, m):
        if i == 5:
            raise KeyboardInterrupt

    with OpTimeDB(tmp_path / "db.sqlite") as db:
        with pytest.raises(KeyboardInterrupt):
            profile_layouts(model, cluster, 4, layouts, db, device, info, progress=interrupt_after_five)
    with OpTimeDB(tmp_path / "db.sqlite") as db:
        assert len(db.known_keys(info)) == 5
        seen = []
        result = profile_layouts(model, cluster, 4, layouts, db, device, info,
                                 progress=lambda i, n, op, m: seen.append(op.key))
        assert (result.already, result.measured, result.total) == (5, len(keys) - 5, len(keys))
        assert db.known_keys(info) == keys and len(set(seen)) == len(keys) - 5
        again = profile_layouts(model, cluster, 4, layouts, db, device, info)
        assert (again.already, again.measured) == (len(keys), 0)


def test_isolated_measurement_of_one_op(one_thread):
    """The fallback for an op the in-place run does not show: rebuilt from its key and timed alone."""
    model, cluster = et.load_model(str(MODEL)), et.load_cluster(str(CLUSTER))
    ops = distinct_ops(model, cluster, 4, [tiny_layout()])
    gemm = next(op for op in ops if op.kind == "gemm")
    m = measure_key(gemm.key, local_device("cpu")[0], warmup=1, min_repeats=3, max_repeats=3)
    assert m.time_s > 0 and m.repeats == 3 and m.method == "thread-cpu-time"


def test_unreadable_database_is_one_line(tmp_path):
    path = tmp_path / "broken.sqlite"
    path.write_text("not a database " * 100)
    with pytest.raises(ConfigError) as err:
        load_op_times(path, "cpu-test")
    assert "\n" not in str(err.value)


def test_a_search_space_gives_the_ops_of_every_traced_shape():
    from echo_tune.optime.collect import space_layouts

    model, cluster, by_gpus = space_layouts(CLUSTER.parent / "tiny-space.yaml")
    layouts = by_gpus[4]
    shapes = {(p.tensor_model_parallel_size, p.micro_batch_size) for p in layouts}
    assert shapes == {(1, 1), (1, 2), (2, 1), (2, 2)}
    ops = distinct_ops(model, cluster, 4, layouts)
    one = distinct_ops(model, cluster, 4, [layouts[0]])
    assert len({op.key for op in ops}) == len(ops) > len(one)
    assert {op.key for op in one} <= {op.key for op in ops}


def test_a_shape_that_does_not_fit_is_timed_op_by_op(tmp_path, one_thread, monkeypatch):
    from echo_tune.optime import profiler

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(profiler, "measure_in_situ", no_memory)
    model, cluster = et.load_model(str(MODEL)), et.load_cluster(str(CLUSTER))
    device, info = local_device("cpu")
    with OpTimeDB(tmp_path / "db.sqlite") as db:
        result = profile_layouts(model, cluster, 4, [tiny_layout()], db, device, info, warmup=1, min_repeats=1,
                                 max_repeats=1)
        assert result.measured == result.total > 0 and result.host_overhead_s is None
    rows = sqlite3.connect(tmp_path / "db.sqlite").execute("SELECT DISTINCT method FROM op_times").fetchall()
    assert rows == [("thread-cpu-time",)]
