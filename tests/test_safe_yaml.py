"""YAML and JSON from users are read within stated limits (echo_tune/safe_yaml.py): size, nesting depth and
values after alias expansion, each refused in one line before the data is built."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from echo_tune.errors import ConfigError
from echo_tune.safe_yaml import MAX_DEPTH, MAX_INPUT_BYTES, MAX_NODES, load_json, load_yaml

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((REPO / "search_spaces").rglob("*.yaml"))[:20]
                         + [REPO / "echo_tune" / "config" / "presets" / "models.yaml"])
def test_shipped_files_read_as_pyyaml_reads_them(path):
    text = path.read_text()
    assert load_yaml(text, str(path)) == yaml.safe_load(text)


def test_aliases_that_stay_small_are_fine():
    assert load_yaml("a: &a [1, 2]\nb: *a\nc: *a\n", "f") == {"a": [1, 2], "b": [1, 2], "c": [1, 2]}


def test_limits_are_refused_quickly():
    lol = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]'] + [
        f"{n}: &{n} [" + ",".join([f"*{p}"] * 10) + "]" for p, n in zip("abcdef", "bcdefg")]
    start = time.monotonic()
    for text, words in (("a: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "nests deeper"),
                        ("\n".join(lol), f"{MAX_NODES:,} values"),
                        ("# " + "x" * MAX_INPUT_BYTES, "MiB")):
        with pytest.raises(ConfigError, match=words) as err:
            load_yaml(text, "file f")
        assert "\n" not in str(err.value)
    assert time.monotonic() - start < 10


def test_json_depth_and_size():
    assert load_json('{"a": [1, {"b": "[[[["}]}', "f") == {"a": [1, {"b": "[[[["}]}
    with pytest.raises(ConfigError, match="nests deeper"):
        load_json("[" * 20000 + "]" * 20000, "f")
