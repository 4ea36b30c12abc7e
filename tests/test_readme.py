"""The README's commands run in a fresh clone: every `echo-tune ...` line of its ```bash blocks and its Python
example, from a scratch folder that sees the repository's `search_spaces/` and `calibration/`.

Documented subset: a command that starts processes on GPUs (`echo-tune bench --nproc-per-node ...`, torchrun)
is not run here; `pip install` and `pytest` are what CI itself runs.
"""

from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import pytest

from echo_tune.cli.main import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
NOT_RUN = ("--nproc-per-node",)


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", README.read_text(), flags=re.M | re.S)


def readme_commands() -> list[str]:
    commands = []
    for block in _blocks("bash"):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            for part in line.split(" #")[0].split("&&"):
                part = part.strip()
                if re.match(r"echo-tune( |$)", part) and not any(flag in part for flag in NOT_RUN):
                    commands.append(part)
    return commands


def test_the_readme_has_commands_for_each_job():
    names = {shlex.split(c)[1] for c in readme_commands()}
    assert {"search", "calibrate", "rank", "plan", "simulate"} <= names


def test_readme_is_short_and_starts_with_its_accuracy_table():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert text.index("## How far to trust it") < text.index("## Set-up")
    assert not re.search(r"\bissues? \d", text, flags=re.I)  # issue numbers mean nothing to a reader


@pytest.fixture()
def scratch(tmp_path, monkeypatch):
    for name in ("search_spaces", "calibration"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs(scratch, command):
    argv = []
    for word in shlex.split(command)[1:]:
        argv += sorted(glob.glob(word)) if any(c in word for c in "*?[") else [word]
    assert main(argv) == 0, command


def test_readme_python_example_runs(scratch):
    (block,) = _blocks("python")
    exec(compile(block, "README.md", "exec"), {})
