"""Function-level imports only where start-up time needs them (issue 42): each says why in a comment, on the line
above or at its end; every other import stands at the top of its module."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "echo_tune"


def _function_imports(source: str) -> list[tuple[int, int]]:
    """(first line, last line) of each import inside a function (TYPE_CHECKING blocks are not run: left out)."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", getattr(child.test, "attr", None)) == \
                    "TYPE_CHECKING":
                continue
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child.lineno, child.end_lineno))
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    return found


def _unexplained(source: str) -> list[int]:
    lines = source.split("\n")
    return [first for first, last in _function_imports(source)
            if not (lines[first - 2].strip().startswith("#") or "  #" in lines[last - 1])]


def test_every_function_level_import_says_why():
    missing = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
               for line in _unexplained(path.read_text())]
    assert missing == []


def test_the_check_finds_an_unexplained_import():
    source = ("import os\n\ndef f():\n    import json\n    # lazy: torch takes 1.5 s\n    import torch\n"
              "    import yaml  # lazy: here only\n\ndef g():\n    if True:\n        import csv\n")
    assert _function_imports(source) == [(4, 4), (6, 6), (7, 7), (11, 11)]
    assert _unexplained(source) == [4, 11]
