"""docs/architecture.md is what `python benchmarks/architecture_page.py --write` writes from the tree."""

from pathlib import Path

import pytest

from architecture_page import PAGE, page


def test_the_committed_page_is_the_generated_one():
    assert PAGE.read_text() == page(), "rerun: python benchmarks/architecture_page.py --write"


def test_page_lists_every_module_and_reads_room_docstrings(tmp_path: Path):
    pkg = tmp_path / "echo_tune"
    for name in ("config", "workload", "cost", "sim", "search", "calibrate", "validate", "optime", "emulate", "plan",
                 "cli"):
        (pkg / name).mkdir(parents=True)
        (pkg / name / "__init__.py").write_text(f'"""The {name} package.\n\nMore detail."""\n')
    (pkg / "__init__.py").write_text('"""Top."""\n')
    (pkg / "sim" / "schedule").mkdir()
    (pkg / "sim" / "schedule" / "__init__.py").write_text('"""One pipeline\'s schedule,\nwrapped."""\n')
    (pkg / "sim" / "schedule" / "engine.py").write_text("")
    (pkg / "sim" / "simulate.py").write_text("")
    text = page(tmp_path)
    assert "| `sim/` | The sim package. | `schedule/` |" in text  # first paragraph only
    assert "| `schedule/` | One pipeline's schedule, wrapped. | `engine` |" in text
    assert "| (root) | the entry points | `simulate` |" in text
    assert "| `plan/` | The plan package. | none (one room) |" in text


def test_a_package_missing_from_the_layers_is_an_error(tmp_path: Path):
    (tmp_path / "echo_tune" / "newpkg").mkdir(parents=True)
    (tmp_path / "echo_tune" / "newpkg" / "__init__.py").write_text("")
    with pytest.raises(SystemExit, match="LAYERS must name every package"):
        page(tmp_path)
