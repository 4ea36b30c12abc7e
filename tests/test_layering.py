"""The package layering (config -> workload -> cost -> sim -> search/calibrate/validate -> plan -> cli): no cycle
between packages of echo_tune, and no package imports another's private (underscore) names."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "echo_tune"


def _unit(module: str) -> str | None:
    """The package (a folder of echo_tune) or top-level module that ``echo_tune.<...>`` belongs to."""
    parts = module.split(".")
    if parts[0] != "echo_tune" or len(parts) < 2:
        return None
    return parts[1]


def _imports() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    edges: dict[str, set[str]] = defaultdict(set)
    private = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        source = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [(node.module, [a.name for a in node.names])]
            elif isinstance(node, ast.Import):
                modules = [(a.name, []) for a in node.names]
            else:
                continue
            for module, names in modules:
                target = _unit(module)
                if target is None or target == source:
                    continue
                edges[source].add(target)
                private += [(str(rel), module, n) for n in names if n.startswith("_") and not n.startswith("__")]
    return edges, private


def _cycles(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    return sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in reach(b)})


def test_no_import_cycle_between_packages():
    edges, _ = _imports()
    assert "sim" in edges and "cost" in edges["sim"]  # the walk sees the real graph
    assert _cycles(edges) == []


def test_no_package_imports_anothers_private_names():
    _, private = _imports()
    assert private == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [("a", "b"), ("a", "c"), ("b", "c")]
