"""The flag-list generator reads add_argument calls and ArgumentGroupFactory dataclasses by AST, from a
checkout or a git directory; the checked-in list is what it writes for Megatron-LM d98e8a64ddf3."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from echo_tune.config.flags.flag_catalog import CATALOG
from echo_tune.config.flags.flag_catalog_build import build_catalog, dump, main
from echo_tune.config.flags.flag_catalog_source import SourceTree

ARGUMENTS = '''
import argparse
from megatron.training.argument_utils import ArgumentGroupFactory
from megatron.core import DemoConfig

def add_megatron_arguments(parser):
    parser = _add_demo_args(parser)
    return parser

def _add_demo_args(parser):
    exclude = ["hidden"]
    ArgumentGroupFactory(DemoConfig, exclude=exclude).build_group(parser, "demo")
    group = parser.add_argument_group(title="demo")
    group.add_argument("--plain", type=int, default=1, help="A number.")
    group.add_argument("--switch", action="store_true", dest="switched")
    group.add_argument("--toggle", action=argparse.BooleanOptionalAction)
    group.add_argument("--mode", choices=["a", "b"], help="Deprecated: " + "use --plain.")
    group.add_argument("--old_name", "--old-name", nargs="+")
    return parser

def _never_called(parser):
    parser.add_argument("--dead")
'''
CONFIG = '''
import enum
from dataclasses import dataclass, field
from typing import Literal, Optional
from .base import BaseConfig

class Color(enum.Enum):
    red = 1
    blue = 2

@dataclass
class DemoConfig(BaseConfig):
    use_fusion: bool = True
    use_extra: bool = False
    sizes: Optional[list[int]] = None
    style: Literal["x", "y"] = "x"
    color: Color = Color.red
    hidden: int = 3
    derived: int = field(default=0, init=False)
    renamed: bool = field(default=True, metadata={"argparse_meta": {"arg_names": ["--keep-renamed"], "dest": "kept"}})
'''
BASE = '''
from dataclasses import dataclass

@dataclass
class BaseConfig:
    num_things: int = 0
'''


def write_tree(root: Path) -> Path:
    files = {"megatron/training/arguments.py": ARGUMENTS, "megatron/core/config.py": CONFIG,
             "megatron/core/__init__.py": "from .config import DemoConfig\n", "megatron/core/base.py": BASE}
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text))
    return root


def test_generator_reads_add_argument_and_dataclass_flags(tmp_path):
    warnings = []
    flags = build_catalog(SourceTree.open(write_tree(tmp_path)), warnings.append)["flags"]
    # worked out by hand from argparse and ArgumentGroupFactory (argument_utils.py, d98e8a64ddf3):
    assert set(flags) == {"--num-things", "--no-use-fusion", "--disable-use-fusion", "--use-extra", "--sizes",
                          "--style", "--color", "--keep-renamed", "--plain", "--switch", "--toggle", "--no-toggle",
                          "--mode", "--old_name", "--old-name"}  # not --hidden (excluded), --derived, --dead
    assert flags["--no-use-fusion"] == {"dest": "use_fusion", "takes_value": False, "action": "store_false",
                                        "aliases": ["--disable-use-fusion"], "origin": "DemoConfig.use_fusion"}
    assert flags["--use-extra"]["action"] == "store_true" and flags["--num-things"]["takes_value"]
    assert flags["--sizes"]["nargs"] == "+" and flags["--style"]["choices"] == ["x", "y"]
    assert flags["--color"]["choices"] == ["red", "blue"]  # the enum's member names (Enum[cli_arg])
    assert flags["--keep-renamed"]["dest"] == "kept" and flags["--keep-renamed"]["action"] == "store_false"
    assert flags["--switch"] == {"dest": "switched", "takes_value": False, "action": "store_true",
                                 "origin": "training/arguments.py:_add_demo_args"}
    assert flags["--no-toggle"]["dest"] == "toggle" and not flags["--no-toggle"]["takes_value"]
    assert flags["--mode"]["deprecated"] and flags["--old-name"]["dest"] == "old_name"
    assert warnings == ["megatron/post_training/arguments.py is not in the tree; its flags are left out"]


def test_generator_reads_a_git_directory_at_a_commit(tmp_path):
    repo = write_tree(tmp_path / "repo")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "demo"], check=True)
    first = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    (repo / "megatron/core/base.py").write_text(BASE.replace("num_things", "num_widgets"))
    subprocess.run([*git, "commit", "-qam", "rename"], check=True)
    out = tmp_path / "flags.json"
    assert main(["--megatron", str(repo / ".git"), "--commit", first[:8], "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["commit"] == first and "--num-things" in data["flags"] and "--num-widgets" not in data["flags"]


MIRROR = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")


@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the Megatron-LM git mirror")
def test_checked_in_list_is_what_the_generator_writes_for_d98e8a64ddf3():
    catalog = build_catalog(SourceTree.open(MIRROR, "d98e8a64ddf3"), lambda msg: None)
    assert dump(catalog) == CATALOG.read_text()
