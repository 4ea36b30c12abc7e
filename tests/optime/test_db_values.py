"""Op-time database values are checked when read (issue 20 item 8): negative, zero, NaN or text times, a
foreign schema, an empty or non-SQLite file are one-line errors, and reading never modifies the file."""

from __future__ import annotations

import sqlite3

import pytest

from echo_tune.errors import ConfigError
from echo_tune.cost.optime.optime_db import Measurement, OpTimeDB, load_op_times
from echo_tune.cost.optime.optime_device import DeviceInfo

CPU = DeviceInfo(name="cpu: test (1 threads)", kind="cpu", torch_version="2.13.0", cuda_version="none")
KEY = '["aten.mm.default",[{"t":[4,8],"s":[8,1],"d":"float32"},{"t":[8,2],"s":[2,1],"d":"float32"}],{}]'


def db_with_time(path, time_s) -> str:
    """A one-row op-time database at ``path`` whose stored time is then overwritten with ``time_s`` (any
    value SQLite takes: negative, zero, infinite, text), as a damaged or hand-edited database holds it."""
    with OpTimeDB(path) as db:
        db.add(CPU, KEY, Measurement(time_s=1e-5, spread=0.1, repeats=5, warmup=3, method="thread-cpu-time"))
    conn = sqlite3.connect(path)
    conn.execute("UPDATE op_times SET time_s=?", (time_s,))
    conn.commit()
    conn.close()
    return str(path)


def _refused(path, *words) -> str:
    with pytest.raises(ConfigError) as err:
        load_op_times(path, "cpu-test")
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text
    return text


@pytest.mark.parametrize("bad", [-6e-2, 0.0, float("inf"), float("-inf"), "fast", b"\x00"])  # SQLite keeps no NaN
def test_a_time_that_is_not_a_positive_number_is_refused(tmp_path, bad):
    _refused(db_with_time(tmp_path / "db.sqlite", bad), "time_s > 0", "1 row")


def test_a_good_database_still_reads(tmp_path):
    assert load_op_times(db_with_time(tmp_path / "db.sqlite", 2e-5), "cpu-test").times == {KEY: 2e-5}


def test_a_foreign_schema_is_refused(tmp_path):
    path = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE op_times (name TEXT, value TEXT)")
    conn.execute("CREATE TABLE info (name TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO info VALUES ('schema_version', '1')")
    conn.commit()
    conn.close()
    _refused(path, "echo-tune profile")
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    _refused(other, "echo-tune profile")


def test_an_empty_file_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "afile"
    path.write_bytes(b"")
    _refused(path, "is empty", "echo-tune profile")
    assert path.read_bytes() == b""  # not turned into a database
