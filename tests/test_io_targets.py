"""Issue 41: an output that is a device, a FIFO or a standard stream is written as the user named it, never
swapped for a regular file by the atomic rename; a failed write (ENOSPC, EFBIG, EPIPE) is one line naming the
output, never a success.

Run as root, a test must not touch a real device node in a way the old code would replace: FIFOs made in
the test's folder stand for devices, and /dev/full is reached through /dev/fd/N of a descriptor the test
opened (a link the old code refused, so it never renamed over /dev/full either)."""

from __future__ import annotations

import json
import os
import resource
import stat
import threading
from pathlib import Path

import pytest

from echo_tune.cli.main import main
from echo_tune.errors import ConfigError
from echo_tune.io import atomic_path, check_not_symlink, write_text

REPO = Path(__file__).resolve().parents[1]
LOG2 = REPO / "calibration" / "azure-ndv4-a100-40gb" / "nccl-tests" / "all_reduce_2gpu.log"
A100 = str(REPO / "calibration" / "azure-ndv4-a100-40gb" / "cluster.yaml")
SIM = ["simulate", "--model", "gpt-1.7b", "--num-gpus", "8", "--global-batch-size", "64"]
SEARCH = ["search", "--model", "gpt-1.7b", "--cluster", "a100-80gb", "--num-gpus", "8", "--global-batch-size",
          "64", "--n-trials", "1", "--sampler", "random"]


class Fifo:
    """A named pipe in the test's folder and a reader thread that collects what is written to it."""

    def __init__(self, path: Path, *, read_bytes: int | None = None):
        self.path = path
        os.mkfifo(path)
        self.got: list[bytes] = []

        def read() -> None:
            with open(path, "rb") as f:
                self.got.append(f.read() if read_bytes is None else f.read(read_bytes))
        self.thread = threading.Thread(target=read, daemon=True)  # a FIFO the code never opens: left behind
        self.thread.start()

    def data(self) -> bytes:
        self.thread.join(timeout=30)
        return b"".join(self.got)

    def still_a_fifo(self) -> bool:
        return stat.S_ISFIFO(os.lstat(self.path).st_mode)


def _one_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("echo-tune")]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.fixture
def dev_full():
    """/dev/fd/N of a descriptor open on /dev/full (every write: ENOSPC); /dev/full is checked afterwards."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    fd = os.open("/dev/full", os.O_WRONLY)
    yield f"/dev/fd/{fd}"
    os.close(fd)
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


def test_write_text_to_a_fifo_keeps_the_fifo(tmp_path):
    fifo = Fifo(tmp_path / "out.json")
    write_text(fifo.path, "{}\n", "trace")
    assert fifo.data() == b"{}\n" and fifo.still_a_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temporary left beside it


def test_atomic_path_to_a_fifo_copies_what_was_drawn(tmp_path):
    fifo = Fifo(tmp_path / "plot.png")
    with atomic_path(fifo.path, "plot") as tmp:
        tmp.write_bytes(b"\x89PNG drawn")
    assert fifo.data() == b"\x89PNG drawn" and fifo.still_a_fifo()


@pytest.mark.parametrize("name", ["-", "/dev/stdout"])
def test_stdout_is_written_not_refused(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_not_symlink(name, "--write-profile file")  # /dev/stdout is a link, but no one's file
    write_text(name, "to stdout\n", "trace")
    with atomic_path(name, "plot") as tmp:
        tmp.write_text("drawn\n")
    assert capsys.readouterr().out == "to stdout\ndrawn\n"
    assert list(tmp_path.iterdir()) == []  # no file named "-"


def test_a_full_device_is_one_line_naming_it(dev_full):
    with pytest.raises(ConfigError) as info:
        write_text(dev_full, "x" * 100, "trace")
    assert str(info.value).startswith(f"disk full: cannot write trace {dev_full!r}")
    assert "\n" not in str(info.value)


def test_a_reader_that_goes_away_is_one_line_naming_the_pipe(tmp_path):
    fifo = Fifo(tmp_path / "trace.json", read_bytes=10)
    with pytest.raises(ConfigError, match=r"trace '.*trace.json': Broken pipe \(its reader closed it") as info:
        write_text(fifo.path, "x" * (8 << 20), "trace")  # far more than a pipe's buffer
    assert "\n" not in str(info.value) and fifo.still_a_fifo()


def test_a_file_size_limit_is_one_line_naming_the_output(tmp_path):
    path = tmp_path / "trials.csv"
    path.write_text("old\n")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, hard))  # Python ignores SIGXFSZ: write() gets EFBIG
    try:
        with pytest.raises(ConfigError) as info:
            write_text(path, "x" * (1 << 20), "trials file")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert f"trials file {str(path)!r}: File too large" in str(info.value)  # the old line named "?"
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["trials.csv"]


def test_simulate_trace_to_a_fifo(tmp_path, capsys):
    fifo = Fifo(tmp_path / "trace.json")
    assert main(SIM + ["--trace", str(fifo.path)]) == 0
    assert "traceEvents" in json.loads(fifo.data()) and fifo.still_a_fifo()


@pytest.mark.parametrize("name", ["-", "/dev/stdout"])
def test_simulate_trace_to_stdout(name, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(SIM + ["--trace", name, "--json"]) == 0
    out = capsys.readouterr().out
    assert '"traceEvents"' in out and list(tmp_path.iterdir()) == []


def test_simulate_trace_to_a_full_device_is_not_a_success(dev_full, capsys):
    assert main(SIM + ["--trace", dev_full]) == 2
    line = _one_line(capsys)
    assert "disk full: cannot write" in line and dev_full in line
    assert "timeline written" not in capsys.readouterr().out


def test_search_write_space_and_trials_csv_to_fifos(tmp_path, capsys):
    space = Fifo(tmp_path / "space.yaml")
    study = tmp_path / "results" / "s"
    study.mkdir(parents=True)
    trials = Fifo(study / "trials.csv")
    assert main(SEARCH + ["--write-space", str(space.path), "--results-dir", str(tmp_path / "results"),
                          "--study-name", "s"]) == 0
    assert b"num_gpus" in space.data() and space.still_a_fifo()
    assert trials.data().startswith(b"trial,") and trials.still_a_fifo()
    assert (study / "best.json").is_file()


def test_calibrate_fit_out_to_a_fifo(tmp_path, capsys):
    fifo = Fifo(tmp_path / "profile.yaml")
    assert main(["calibrate", "fit", "--cluster", A100, "--nccl-tests", str(LOG2), "--out", str(fifo.path)]) == 0
    assert b"name:" in fifo.data() and fifo.still_a_fifo()


def test_a_plot_to_a_fifo(tmp_path):
    pytest.importorskip("matplotlib")
    from echo_tune.plots import plot_breakdowns

    fifo = Fifo(tmp_path / "plan.png")
    plot_breakdowns([{"label": "a", "breakdown_s": {"compute": 1.0, "comm": 0.5}}], fifo.path, title="t")
    assert fifo.data().startswith(b"\x89PNG") and fifo.still_a_fifo()


def test_a_plot_to_a_path_without_a_suffix_is_png(tmp_path):
    pytest.importorskip("matplotlib")
    from echo_tune.plots import plot_breakdowns

    plot_breakdowns([{"label": "a", "breakdown_s": {"compute": 1.0}}], tmp_path / "plan", title="t")
    assert (tmp_path / "plan").read_bytes().startswith(b"\x89PNG")


def test_a_full_standard_output_is_one_line_naming_it():
    """`echo-tune simulate > /dev/full`: the report's own write fails; the line says standard output, not '?'."""
    import subprocess
    import sys

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "echo_tune.cli.main", *SIM], stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == ["echo-tune simulate: error: disk full: cannot write standard output (No space left on device); "
                     "free some space or give another path, and run again"]
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
