"""echo_tune/io.py's safe writing (issue 20): atomic (temp file + os.replace), never through a symlink
unless asked; and the commands that write outputs use it."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main
from echo_tune.errors import ConfigError
from echo_tune.io import atomic_path, write_text

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
LOG2 = REPO / "calibration" / "azure-ndv4-a100-40gb" / "nccl-tests" / "all_reduce_2gpu.log"
A100 = str(REPO / "calibration" / "azure-ndv4-a100-40gb" / "cluster.yaml")


@pytest.fixture
def victim(tmp_path):
    """A file a planted link points at; it must come out of every refused write unchanged."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


def _link(tmp_path: Path, name: str, target: Path) -> Path:
    link = tmp_path / name
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)
    return link


def test_write_refuses_a_symlink_and_keeps_its_target(tmp_path, victim):
    link = _link(tmp_path, "out.json", victim)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_text(link, "{}", "output")
    assert victim.read_text() == "precious\n" and link.is_symlink()


def test_follow_symlinks_when_asked(tmp_path, victim):
    link = _link(tmp_path, "out.txt", victim)
    write_text(link, "new\n", follow_symlinks=True)
    assert victim.read_text() == "new\n" and link.is_symlink()


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "trials.csv"
    path.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["trials.csv"]


def test_a_full_disk_is_one_line_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "best.json"
    path.write_text("old\n")
    with pytest.raises(ConfigError, match="disk full") as info:
        with atomic_path(path, "best layout file"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert "\n" not in str(info.value) and path.read_text() == "old\n"


def test_write_replaces_in_one_rename_and_keeps_permissions(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("a")
    path.chmod(0o640)
    inode = path.stat().st_ino
    write_text(path, "b")
    assert path.read_text() == "b" and path.stat().st_ino != inode and path.stat().st_mode & 0o777 == 0o640


def _one_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("echo-tune")]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize("argv", [
    ["simulate", "--model", "gpt-1.7b", "--num-gpus", "8", "--global-batch-size", "64", "--trace", "{link}"],
    ["search", "--model", "gpt-1.7b", "--cluster", "a100-80gb", "--num-gpus", "8", "--global-batch-size", "64",
     "--n-trials", "1", "--write-space", "{link}"],
    ["calibrate", "fit", "--cluster", A100, "--nccl-tests", str(LOG2), "--out", "{link}"],
])
def test_commands_refuse_to_write_through_a_symlink(argv, tmp_path, victim, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    link = _link(tmp_path, "link.out", victim)
    argv = [a.replace("{link}", str(link)) for a in argv]
    if argv[0] == "search":
        argv += ["--results-dir", str(tmp_path / "results")]
    assert main(argv) == 2
    assert "symbolic link" in _one_line(capsys)
    assert victim.read_text() == "precious\n"


def test_search_resume_refuses_a_planted_best_json(tmp_path, victim, capsys):
    argv = ["search", str(DATA / "tiny-space.yaml"), "--sampler", "exhaustive", "--results-dir", str(tmp_path),
            "--json"]
    assert main(argv) == 0
    best = tmp_path / "tiny-cpu" / "best.json"
    best.unlink()
    os.symlink(victim, best)
    capsys.readouterr()
    assert main(argv + ["--resume"]) == 2
    assert "symbolic link" in _one_line(capsys) and victim.read_text() == "precious\n"


def test_bench_name_stays_under_the_output_root(tmp_path, capsys):
    for name in (str(tmp_path / "elsewhere"), "..", "../up", "a/b"):
        assert main(["bench", "--name", name, "--output-root", str(tmp_path / "root"), "--quick"]) == 2
        assert "--name" in _one_line(capsys)
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "up").exists()


def test_bench_ranks_per_node_must_divide_the_processes(tmp_path, capsys):
    """Refused before torchrun starts (it used to end in torchrun's ChildFailedError traceback)."""
    assert main(["bench", "--nproc-per-node", "2", "--ranks-per-node", "3", "--output-root", str(tmp_path)]) == 2
    line = _one_line(capsys)
    assert "--ranks-per-node" in line and "nproc_per_node=2" in line and "ranks_per_node=3" in line


@pytest.mark.parametrize("content", [b"", b"not a database at all\n"])
def test_a_profile_naming_a_non_database_leaves_it_alone(content, tmp_path, capsys):
    """Reading a profile must never turn the file its `op_times` names into an SQLite database."""
    from echo_tune.cost.profile import default_profile, save_profile
    from echo_tune.config.load.loading import load_cluster

    target = tmp_path / "notes.txt"
    target.write_bytes(content)
    save_profile(default_profile(load_cluster("a100-80gb")), tmp_path / "p.yaml")
    data = yaml.safe_load((tmp_path / "p.yaml").read_text())
    data["op_times"] = "notes.txt"
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(data))
    assert main(["simulate", "--model", "gpt-1.7b", "--cluster", "a100-80gb", "--num-gpus", "8",
                 "--global-batch-size", "64", "--profile", str(tmp_path / "p.yaml")]) == 2
    line = _one_line(capsys)
    assert "op-time database" in line and ("empty" in line or "not an SQLite" in line)
    assert target.read_bytes() == content
