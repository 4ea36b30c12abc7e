"""The package layering (config -> workload -> cost -> sim -> search/calibrate/validate -> plan -> cli): no cycle
between packages of echo_tune, no cycle between its files (no two files import each other, directly or round a
ring, counting every import a file makes: at the top, inside a function, under TYPE_CHECKING), and no package
imports another's private (underscore) names."""

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


def _package_modules() -> dict[str, tuple[str, bool]]:
    """Module name -> (its source, whether it is a package's ``__init__``), for every file of echo_tune."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path.read_text(), is_package)
    return modules


def _file_imports(modules: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """Module -> the echo_tune modules its source imports, wherever the import stands in the file (at the top,
    in a function, under TYPE_CHECKING). ``from pkg import name`` imports the module ``pkg.name`` when there is
    one, else ``pkg`` (its ``__init__``)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for name, (source, is_package) in modules.items():
        package = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, one level up per extra dot
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in modules and t != name}
    return edges


def _file_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        work.append((node, iter(sorted(edges.get(node, ())))))

    for root in sorted(edges):
        if root in index:
            continue
        work: list = []
        enter(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    enter(child)
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups)


def test_no_import_cycle_between_files():
    edges = _file_imports(_package_modules())
    assert "echo_tune.cost.kernels.compute" in edges["echo_tune.sim.schedule.costing"]  # the walk sees the real graph
    cycles = _file_cycles(edges)
    assert cycles == [], "files that import each other (move the shared piece into a module below both): " + \
        "; ".join(" <-> ".join(group) for group in cycles)


def test_file_cycle_finder_sees_imports_inside_functions_and_type_checking():
    modules = {
        "echo_tune.a": ("from echo_tune.b import f\n", False),
        "echo_tune.b": ("def f():\n    from echo_tune.c import g\n", False),
        "echo_tune.c": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import echo_tune.a\n", False),
        "echo_tune.d": ("from echo_tune import a\n", False),
        "echo_tune.pkg": ("from . import mod\n", True),
        "echo_tune.pkg.mod": ("from echo_tune.pkg import helper\n", False),
    }
    edges = _file_imports(modules)
    assert edges["echo_tune.d"] == {"echo_tune.a"}
    assert edges["echo_tune.pkg"] == {"echo_tune.pkg.mod"}
    assert _file_cycles(edges) == [["echo_tune.a", "echo_tune.b", "echo_tune.c"],
                                   ["echo_tune.pkg", "echo_tune.pkg.mod"]]
    assert _file_cycles({"echo_tune.a": {"echo_tune.b"}, "echo_tune.b": set()}) == []


RULE_CHECKS = ("echo_tune.config.rules.compatibility", "echo_tune.config._checks")
"""Besides config/*_rules.py: the modules that check specs. The simulator reads their result, the checked
``Layout`` (config/specs/layout.py, built by config/checked.py), and calls none of them."""


def _is_rule_check(module: str) -> bool:
    return module in RULE_CHECKS or module.startswith("echo_tune.config.rules.") or \
        (module.startswith("echo_tune.config.") and module.endswith("_rules"))


def test_sim_imports_no_rule_check_module():
    edges = _file_imports(_package_modules())
    assert "echo_tune.config.specs.layout" in edges["echo_tune.sim.simulate"]  # the walk sees sim's imports of config
    calls_back = sorted((m, t) for m, targets in edges.items() if m.startswith("echo_tune.sim.")
                        for t in targets if _is_rule_check(t))
    assert calls_back == []
    assert _is_rule_check("echo_tune.config.rules.schedule_rules") and not _is_rule_check("echo_tune.config.specs.layout")
