"""`plan`, `rank` and `search` print every number whole at 80, 120 and 200 columns and in a pipe.

The Markdown output (every column of every table, no width limit) is the reference: each number of each of
its cells must appear, unbroken, on one line of the table output at every width, and no cell is cut (no `…`).
The runs reuse their studies (plan, search) after the first, so the widths cost one search each.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from echo_tune.cli.main import main

DATA = Path(__file__).resolve().parents[1] / "data"
ROOT = Path(__file__).resolve().parents[2]
MODEL = str(DATA / "tiny-llama.yaml")
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")
WIDTHS = (80, 120, 200, None)  # None: a pipe without COLUMNS (160 columns)


def markdown_numbers(text: str) -> set[str]:
    """Every number in the cells of the Markdown tables of ``text``."""
    numbers = set()
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            for cell in line.strip("|").split(" | "):
                numbers.update(n.lstrip("+-").rstrip(",") for n in NUMBER.findall(cell))
    return {n for n in numbers if n}


def whole(number: str, text: str) -> bool:
    """``number`` appears on one line, not as part of a longer number."""
    pattern = re.compile(r"(?<![\d.,])" + re.escape(number) + r"(?![\d]|[.,]\d)")
    return any(pattern.search(line) for line in text.splitlines())


def run_cli(argv: list[str], capsys, monkeypatch, width: int | None) -> str:
    if width is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", str(width))
    capsys.readouterr()
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    return out


def check_widths(argv: list[str], capsys, monkeypatch) -> None:
    reference = run_cli(argv + ["--format", "markdown"], capsys, monkeypatch, None)
    numbers = markdown_numbers(reference)
    assert len(numbers) > 10, reference  # the tables hold numbers to check
    for width in WIDTHS:
        out = run_cli(argv, capsys, monkeypatch, width)
        assert "…" not in out, (width, out)
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= (width or 160), (width, out)
        missing = sorted(n for n in numbers if not whole(n, out))
        assert not missing, (width, missing, out)


@pytest.fixture
def fp8_cluster(tmp_path):
    data = yaml.safe_load((DATA / "cpu-cluster.yaml").read_text())
    data["gpu"] = {**data["gpu"], "name": "cpu-fp8", "peak_fp8_tflops": 0.2}
    small = {**data, "gpu": {**data["gpu"], "name": "cpu-tiny-mem", "memory_bytes": 2**20}}
    del small["gpu"]["peak_fp8_tflops"]
    (tmp_path / "fp8.yaml").write_text(yaml.safe_dump(data))
    (tmp_path / "small.yaml").write_text(yaml.safe_dump(small))
    return tmp_path / "fp8.yaml", tmp_path / "small.yaml"


def test_plan_at_every_width(tmp_path, fp8_cluster, capsys, monkeypatch):
    fp8, small = fp8_cluster
    check_widths(["plan", "--model", MODEL, "--tokens", "3e12", "--global-batch-size", "8", "--n-trials", "10",
                  "--candidate", f"{fp8}:8:2.49:fp8", "--candidate", f"{DATA / 'cpu-cluster.yaml'}:4:1.29",
                  "--candidate", f"{small}:4:0.5", "--memory-headroom-gib", "0",
                  "--results-dir", str(tmp_path / "r")], capsys, monkeypatch)


def test_rank_at_every_width(capsys, monkeypatch):
    check_widths(["rank", str(ROOT / "search_spaces" / "rank" / "gpt3-175b-options.yaml"), "--tokens", "3e11"],
                 capsys, monkeypatch)


def test_search_at_every_width(tmp_path, fp8_cluster, capsys, monkeypatch):
    fp8, _ = fp8_cluster
    check_widths(["search", "--model", MODEL, "--cluster", str(fp8), "--num-gpus", "8", "--global-batch-size", "8",
                  "--fp8-format", "auto", "--n-trials", "10", "--resume", "--results-dir", str(tmp_path / "r")],
                 capsys, monkeypatch)


@pytest.mark.parametrize("command", ["plan", "rank", "search"])
def test_csv_and_json_formats(tmp_path, fp8_cluster, capsys, monkeypatch, command):
    import csv
    import io
    import json

    fp8, _ = fp8_cluster
    argv = {"plan": ["plan", "--model", MODEL, "--tokens", "1e9", "--global-batch-size", "8", "--n-trials", "6",
                     "--candidate", f"{fp8}:8:2.0", "--results-dir", str(tmp_path / "r"), "--no-explain"],
            "rank": ["rank", str(ROOT / "search_spaces" / "rank" / "gpt3-175b-options.yaml")],
            "search": ["search", "--model", MODEL, "--cluster", str(fp8), "--num-gpus", "8", "--global-batch-size",
                       "8", "--n-trials", "6", "--resume", "--results-dir", str(tmp_path / "r"), "--no-explain"]}[command]
    rows = list(csv.reader(io.StringIO(run_cli(argv + ["--format", "csv"], capsys, monkeypatch, 80))))
    assert len(rows) >= 2 and all(len(r) == len(rows[0]) for r in rows)
    assert "…" not in "".join(map(str, rows))
    data = json.loads(run_cli(argv + ["--format", "json"], capsys, monkeypatch, 80))
    assert data
    assert main(argv + ["--json", "--format", "csv"]) == 2  # both: refused in one line
    assert "not both" in capsys.readouterr().err
