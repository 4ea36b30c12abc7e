"""The installed command (``console``): main's exit code, the search's workers ended, no library the command
does not use loaded at start-up."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

from echo_tune.cli import main as cli_main
from echo_tune.plots import available


def test_console_returns_mains_code_and_marks_the_process_as_exiting(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["echo-tune", "presets", "--bogus-flag"])
    monkeypatch.setitem(cli_main._CONSOLE, "exits_after_command", False)
    try:
        with pytest.raises(SystemExit) as exit_info:
            cli_main.console()
    finally:
        gc.unfreeze()
    assert exit_info.value.code == 2
    assert "--bogus-flag" in capsys.readouterr().err
    assert cli_main.exits_after_command()


def test_main_called_from_python_leaves_the_process_as_it_was(tmp_path, monkeypatch):
    """main() from Python (a notebook, these tests) is not an exiting process: a search there freezes nothing."""
    monkeypatch.setitem(cli_main._CONSOLE, "exits_after_command", False)
    assert cli_main.main(["search", "--model", "llama3-8b", "--cluster", "h100", "--num-gpus", "8",
                          "--global-batch-size", "64", "--seq-length", "2048", "--sampler", "random",
                          "--n-trials", "3", "--results-dir", str(tmp_path), "--json"]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_the_parser_loads_no_library_a_search_does_not_use():
    """scipy (calibrate fit), pandas (Pareto files) and matplotlib (plots; a worker draws it) took 1.1 s of
    every search's start-up before they were loaded where used."""
    code = ("import sys; from echo_tune.cli.main import build_parser; build_parser(); "
            "print(sorted(m for m in ('scipy', 'pandas', 'matplotlib', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_matplotlib_is_found_without_importing_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # blocked: not available
    assert available() is False
