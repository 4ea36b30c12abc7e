"""echo_tune/limits.py and echo_tune/io.py: the range table and the one place files are read and written."""

from __future__ import annotations

import math
import os

import pytest

from echo_tune.cost.profile import default_profile, save_profile
from echo_tune.config.load.loading import load_cluster
from echo_tune.errors import ConfigError
from echo_tune.io import ensure_dir, read_csv_rows, read_text, write_text
from echo_tune.limits import LIMITS, check_number, first_non_finite


def test_every_limit_states_its_reason_and_admits_real_values():
    for key, limit in LIMITS.items():
        assert limit.reason and limit.low < limit.high, key
    for key, value in {"num_gpus": 100_000, "seq_length": 1 << 20, "global_batch_size": 1 << 16,
                       "gpu_hour_cost": 2.5, "timeout": 3600, "tokens": 15e12, "vocab_size": 256_000,
                       "hidden_size": 18432, "num_layers": 126, "kernel_launch_overhead_s": 4e-6}.items():
        check_number(key, value)  # no real run is refused


@pytest.mark.parametrize("key,value,fragment", [
    ("num_gpus", float("nan"), "must be finite"), ("num_gpus", float("inf"), "must be finite"),
    ("num_gpus", 0, "`1 <= num_gpus"), ("num_gpus", 2**21, "<= 1048576"), ("num_gpus", 1.5, "whole number"),
    ("num_gpus", True, "must be a number"), ("num_gpus", "8", "must be a number"),
    ("timeout", 0, "`0 < timeout"), ("gpu_hour_cost", 0.0, "`0 < gpu_hour_cost"),
    ("kernel_launch_overhead_s", -1e-3, "`0 <= kernel_launch_overhead_s"),
])
def test_check_number_refuses_in_one_line(key, value, fragment):
    with pytest.raises(ConfigError, match=None) as info:
        check_number(key, value)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_first_non_finite_finds_nested_values():
    assert first_non_finite({"a": {"b": [1.0, float("nan")]}})[0] == "a.b.1"
    assert first_non_finite({"a": [1.0, {"c": 2}]}) is None


def test_a_profile_of_nans_is_never_written(tmp_path):
    profile = default_profile(load_cluster("a100-80gb"))
    bad = profile.__class__(**{**{f: getattr(profile, f) for f in profile.__dataclass_fields__},
                               "slowdown_curves": {"compute": [1.0, math.nan]}})
    with pytest.raises(ConfigError, match="slowdown_curves.compute.1"):
        save_profile(bad, tmp_path / "p.yaml")
    assert not (tmp_path / "p.yaml").exists()


def test_read_text_errors_are_one_line(tmp_path):
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfname,x\n")
    assert read_text(tmp_path / "bom.txt") == "name,x\n"
    (tmp_path / "latin.txt").write_bytes(b"a\nb\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8 text .* at line 2"):
        read_text(tmp_path / "latin.txt", "model file")
    with pytest.raises(ConfigError, match="directory"):
        read_text(tmp_path)
    with pytest.raises(ConfigError, match="check the path"):
        read_text(tmp_path / "missing.txt")


def test_write_and_dirs(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="is a file|Not a directory"):
        ensure_dir(tmp_path / "f")
    with pytest.raises(ConfigError, match="a file stands where a folder is needed"):
        write_text(tmp_path / "f" / "out.json", "{}")
    with pytest.raises(ConfigError, match="directory"):
        write_text(tmp_path, "{}", "--trace file")
    assert write_text(tmp_path / "a" / "b.txt", "ok").read_text() == "ok"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match="not writable"):
        ensure_dir(folder)


def test_csv_rows(tmp_path):
    path = tmp_path / "r.csv"
    path.write_bytes(b"\xef\xbb\xbfname,n\r\na,1\r\n\r\nb,2\r\n")
    assert read_csv_rows(path) == (["name", "n"], [{"name": "a", "n": "1"}, {"name": "b", "n": "2"}])
    path.write_text("name,n\na\n")
    with pytest.raises(ConfigError, match="line 2: 1 fields but the header has 2"):
        read_csv_rows(path)
    path.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        read_csv_rows(path)
