"""Issue 41 item 5: what reaches the terminal is safe and readable. Control characters from files and names
are escaped, ``COLUMNS=0`` or ``1`` still prints a readable report, and a trace cache that cannot be looked
into is skipped with a note instead of failing the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.text import Text

from echo_tune.cli.main import main
from echo_tune.console import make_console
from echo_tune.tables import Column, TextTable, print_table

HF = Path(__file__).resolve().parent / "config" / "data" / "hf"
SIM = ["simulate", "--model", "gpt-1.7b", "--num-gpus", "8", "--global-batch-size", "64"]
RED = "\x1b[31m"
MIN_WIDTH = 40  # echo_tune.console.MIN_WIDTH


def test_a_config_json_name_cannot_colour_the_terminal(tmp_path, capsys, monkeypatch):
    cfg = json.loads((HF / "qwen2.5-7b.json").read_text())
    cfg["_name_or_path"] = f"org/qwen{RED}EVIL\x1b]0;title\x07"  # a colour and a window-title sequence
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "--model", "m/config.json", "--cluster", "h100", "--num-gpus", "16",
                 "--global-batch-size", "64", "--seq-length", "4096"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "qwen\\x1b[31mEVIL\\x1b]0;title\\x07" in out  # shown, escaped, not hidden


def test_a_study_name_cannot_colour_the_terminal(tmp_path, capsys):
    assert main(["search", "--model", "gpt-1.7b", "--cluster", "a100-80gb", "--num-gpus", "8",
                 "--global-batch-size", "64", "--n-trials", "1", "--sampler", "random",
                 "--results-dir", str(tmp_path), "--study-name", f"s{RED}x"]) == 0
    captured = capsys.readouterr()
    assert "\x1b" not in captured.out + captured.err and "s\\x1b[31mx" in captured.out


@pytest.mark.parametrize("fmt", ["table", "csv", "markdown"])
def test_table_cells_are_escaped_in_every_format(fmt, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    table = TextTable(title="t", columns=[Column(header=f"h{RED}"), Column(header="n", priority=1)])
    table.add_row(f"a{RED}b\rc", "1")
    print_table(table, fmt)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out and "a\\x1b[31mb\\x0dc" in out


def test_escaped_text_keeps_its_styles_on_the_same_characters():
    from echo_tune.console import escape_text

    text = Text(f"ab{RED}cd")
    text.stylize("bold", 0, 3)  # "ab" and the ESC
    out = escape_text(text)
    assert out.plain == "ab\\x1b[31mcd"
    assert [(s.start, s.end, str(s.style)) for s in out.spans] == [(0, 6, "bold")]


@pytest.mark.parametrize("columns", ["0", "1", "7"])
def test_a_tiny_columns_still_prints_a_readable_report(columns, capsys, monkeypatch):
    from echo_tune import console

    assert getattr(console, "MIN_WIDTH", MIN_WIDTH) == MIN_WIDTH
    monkeypatch.setenv("COLUMNS", columns)
    assert make_console().width >= MIN_WIDTH
    assert main(SIM) == 0
    out = capsys.readouterr().out
    assert "gpt-1.7b on 8 x a100-80gb" in out and "step part" in out  # whole words, not one letter a line
    table_lines = [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]
    assert table_lines and max(map(len, table_lines)) <= (160 if columns == "0" else MIN_WIDTH)


def test_an_unreadable_trace_cache_is_skipped_with_a_note(tmp_path, capsys, monkeypatch):
    """A cache folder that cannot be looked into (as root, permissions bind no one, so a name too long for
    the file system: stat() fails with ENAMETOOLONG, as it fails with EACCES for a user)."""
    from echo_tune.sim.schedule import passes
    from echo_tune.sim.schedule import trace_cache

    monkeypatch.setattr(passes, "_PIECES", {})  # this process traced nothing yet: the cache is asked
    monkeypatch.setattr(trace_cache, "_UNUSABLE", set())
    monkeypatch.setenv("ECHO_TUNE_CACHE_DIR", str(tmp_path / ("x" * 300)))
    monkeypatch.delenv("ECHO_TUNE_TRACE_CACHE", raising=False)
    assert main(SIM) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if "trace cache" in line]
    assert len(notes) == 1 and notes[0].startswith("note: the trace cache folder") and "too long" in notes[0]
    assert "step part" in captured.out
