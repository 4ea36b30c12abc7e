"""Op-time databases read within physical bounds (issue 41 item 4): a time below one nanosecond (1e-300 s, which
simulated to an MFU above 100%) or a GEMM faster than its GPU's fastest tensor cores is refused in one line;
a database of another schema or with damaged pages is one line for reading and for writing (`echo-tune
profile`), and a foreign file is left byte for byte as it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.config.load.loading import load_cluster
from echo_tune.cost.optime.optime_bounds import MIN_OP_TIME_S, gemm_flops
from echo_tune.cost.optime.optime_db import Measurement, OpTimeDB, load_op_times
from echo_tune.cost.optime.optime_device import DeviceInfo
from echo_tune.cost.profile import default_profile, save_profile
from echo_tune.errors import ConfigError
from .test_db_values import CPU, KEY, db_with_time

REPO = Path(__file__).resolve().parents[2]
CPU_CLUSTER = str(REPO / "tests" / "data" / "cpu-cluster.yaml")
TINY = str(REPO / "tests" / "data" / "tiny-llama.yaml")
A100 = DeviceInfo(name="NVIDIA A100-SXM4-80GB", kind="cuda", torch_version="2.13.0", cuda_version="12.8")


def _mm(m: int, k: int, n: int, op: str = "aten.mm.default") -> str:
    a, b = {"t": [m, k], "s": [k, 1], "d": "bfloat16"}, {"t": [k, n], "s": [n, 1], "d": "bfloat16"}
    args = [a, b] if op != "aten.addmm.default" else [{"t": [n], "s": [1], "d": "bfloat16"}, a, b]
    return json.dumps([op, args, {}], separators=(",", ":"))


def _one_line(fn, *words) -> str:
    with pytest.raises(ConfigError) as err:
        fn()
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


@pytest.mark.parametrize("bad", [1e-300, 1e-12, 5e-10])
def test_a_time_below_a_nanosecond_is_refused(tmp_path, bad):
    path = db_with_time(tmp_path / "db.sqlite", bad)
    _one_line(lambda: load_op_times(path, "cpu-test"), f"`time_s >= {MIN_OP_TIME_S:g}`", "1 row(s)", repr(bad))


def test_a_nanosecond_and_more_still_read(tmp_path):
    assert load_op_times(db_with_time(tmp_path / "db.sqlite", 1e-9), "cpu-test").times == {KEY: 1e-9}


def test_simulate_refuses_a_database_of_1e_300_s_ops(tmp_path, capsys):
    save_profile(default_profile(load_cluster(CPU_CLUSTER)), tmp_path / "profile.yaml")
    profile = yaml.safe_load((tmp_path / "profile.yaml").read_text())
    profile["op_times"] = db_with_time(tmp_path / "db.sqlite", 1e-300)
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    code = main(["simulate", "--model", TINY, "--cluster", CPU_CLUSTER, "--num-gpus", "1", "--global-batch-size", "1",
                 "--profile", str(tmp_path / "profile.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and "`time_s >= 1e-09`" in err, err


def _a100_db(path, key: str, time_s: float) -> str:
    with OpTimeDB(path) as db:
        db.add(A100, key, Measurement(time_s=time_s, spread=0.1, repeats=5, warmup=3, method="cuda-events"))
    return str(path)


@pytest.mark.parametrize("op", ["aten.mm.default", "aten.addmm.default"])
def test_a_gemm_faster_than_the_gpus_peak_is_refused(tmp_path, op):
    key = _mm(8192, 8192, 8192, op)  # 1.1e12 FLOPs: >= 3.2 ms at 343 TFLOP/s (A100 fp16 312 x 1.1)
    assert gemm_flops(key) == 2.0 * 8192 ** 3
    path = _a100_db(tmp_path / "fast.sqlite", key, 1e-4)
    _one_line(lambda: load_op_times(path, "a100-80gb"), "`time_s >= FLOPs / peak`", "a100-80gb", "343 TFLOP/s",
              "1 row(s)")
    good = _a100_db(tmp_path / "good.sqlite", key, 4.5e-3)  # 244 TFLOP/s: a real A100 GEMM
    assert load_op_times(good, "a100-80gb").times == {key: 4.5e-3}


def test_only_gemm_keys_have_flops():
    assert gemm_flops(KEY) == 2.0 * 4 * 8 * 2
    bmm = json.dumps(["aten.bmm.default", [{"t": [3, 4, 8]}, {"t": [3, 8, 2]}], {}], separators=(",", ":"))
    assert gemm_flops(bmm) == 2.0 * 3 * 4 * 8 * 2
    for key in ('["aten.add.Tensor",[{"t":[4,8]},{"t":[4,8]}],{}]', '["aten.mm.default",[{"t":[4,8]},{"t":[9,2]}],{}]',
                '["aten.mm.default"' + "[" * 5000, "not json", '["aten.mm.default",[{"t":"x"},{"t":[8,2]}],{}]'):
        assert gemm_flops(key) is None


def _damaged(tmp_path) -> Path:
    """A database of 3,000 rows with 16 KB of its pages overwritten."""
    path = tmp_path / "big.sqlite"
    with OpTimeDB(path) as db:
        for i in range(3000):
            db.conn.execute("INSERT INTO op_times VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                            (CPU.name, CPU.kind, CPU.torch_version, CPU.cuda_version, f"k{i}" + "x" * 300, "op", "s",
                             "d", 1e-5, 0.1, 5, 3, "wall-clock", "h", "2026-12-04"))
        db.conn.commit()
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 3)
        f.write(bytes(range(256)) * 64)
    return path


def test_damaged_pages_are_one_line_for_reading_and_writing(tmp_path):
    path = _damaged(tmp_path)
    _one_line(lambda: load_op_times(path, "cpu-test"), "is damaged", "malformed")

    def resume():
        with OpTimeDB(path) as db:  # `echo-tune profile` resuming into it
            db.known_keys(CPU)
            db.devices()
    _one_line(resume, "is damaged", "delete the file")


@pytest.mark.parametrize("schema", ["CREATE TABLE op_times (name TEXT)", "CREATE TABLE t (x)", "version 2"])
def test_another_schema_is_refused_for_writing_and_left_as_it_was(tmp_path, schema):
    path = tmp_path / "other.sqlite"
    if schema == "version 2":
        with OpTimeDB(path):
            pass
        conn = sqlite3.connect(path)
        conn.execute("UPDATE info SET value='2'")
        conn.commit()
        conn.close()
    else:
        conn = sqlite3.connect(path)
        conn.execute(schema)
        conn.commit()
        conn.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    _one_line(lambda: OpTimeDB(path), "has another schema", "delete the file")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    _one_line(lambda: load_op_times(path, "cpu-test"), str(path))


def test_a_new_or_own_database_still_opens(tmp_path):
    path = tmp_path / "new.sqlite"
    with OpTimeDB(path) as db:
        db.add(CPU, KEY, Measurement(time_s=1e-5, spread=0.1, repeats=5, warmup=3, method="wall-clock"))
    copy = tmp_path / "copy.sqlite"
    shutil.copy(path, copy)
    with OpTimeDB(copy) as db:
        assert db.known_keys(CPU) == {KEY}
