"""A damaged journal line is reported with its line number and the way out, not a traceback (issue 10)."""

from __future__ import annotations

from echo_tune.cli.main import main

from .conftest import SMALL


def test_corrupt_journal_line_names_its_number(tmp_path, capsys):
    args = ["search", str(SMALL), "--sampler", "random", "--n-trials", "3", "--results-dir", str(tmp_path), "--json"]
    assert main(args) == 0
    journal = tmp_path / "small-gpt7b-16xa100" / "journal.log"
    lines = journal.read_text().splitlines()
    lines[2] = '{"op_code": 5, "worker_id": "x", broken'
    journal.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(args[:5] + ["5"] + args[6:] + ["--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 3 is not a JSON record" in err and "--overwrite" in err
