"""Reading a Megatron-LM source tree for the flag catalog: files, modules and classes, by AST only.

A tree is a checkout directory or a (bare) git directory at a commit; nothing of it is imported or run.
Classes are found the way Python would find them: defined in the module, or imported into it
(``from x import Name``, followed through package ``__init__.py`` re-exports and relative imports).
"""

from __future__ import annotations

import ast
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from echo_tune.errors import ConfigError

UNKNOWN = object()
"""A value the AST does not spell as a literal (a call, a name, an f-string)."""


def literal(node: ast.AST | None):
    """The Python value of a literal node (strings joined with ``+`` included), else ``UNKNOWN``."""
    if node is None:
        return UNKNOWN
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = literal(node.left), literal(node.right)
        if left is UNKNOWN or right is UNKNOWN:
            return UNKNOWN
        try:
            return left + right
        except TypeError:
            return UNKNOWN
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return UNKNOWN


@dataclass
class SourceTree:
    """A Megatron-LM tree: ``root`` is a checkout, or a git directory read at ``commit``."""

    root: Path
    commit: str
    git: bool
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, root: str | Path, commit: str | None = None) -> "SourceTree":
        root = Path(root)
        if (root / "megatron").is_dir() and commit is None:
            found = _git(root, "rev-parse", "HEAD") if (root / ".git").exists() else None
            return cls(root=root, commit=found or "unknown", git=False)
        if (root / "objects").is_dir() or (root / ".git").exists():
            resolved = _git(root, "rev-parse", "--verify", f"{commit or 'HEAD'}^{{commit}}")
            if resolved is None:
                raise ConfigError(f"`{commit or 'HEAD'}` must be a commit of {root}, but git cannot find it")
            return cls(root=root, commit=resolved, git=True)
        raise ConfigError(f"--megatron must be a Megatron-LM checkout or git directory, but got ({root})")

    def read(self, path: str) -> str | None:
        if path not in self._cache:
            if self.git:
                self._cache[path] = _git(self.root, "show", f"{self.commit}:{path}", strip=False)
            else:
                file = self.root / path
                self._cache[path] = file.read_text() if file.is_file() else None
        return self._cache[path]

    def parse(self, path: str) -> ast.Module | None:
        key = ("ast", path)
        if key not in self._cache:
            text = self.read(path)
            self._cache[key] = None if text is None else ast.parse(text, filename=path)
        return self._cache[key]

    def module_path(self, module: str) -> str | None:
        """The file of a dotted module name (``a.b`` -> a/b.py or a/b/__init__.py), or None."""
        base = module.replace(".", "/")
        for path in (f"{base}.py", f"{base}/__init__.py"):
            if self.read(path) is not None:
                return path
        return None

    def find_class(self, path: str, name: str, scope: ast.AST | None = None,
                   _seen: frozenset = frozenset()) -> tuple[str, ast.ClassDef] | None:
        """The ClassDef named ``name`` as seen from file ``path`` (and the imports of ``scope``, a function
        of that file, first), following ``from x import`` statements; None when it leaves the tree."""
        if (path, name) in _seen:
            return None
        seen = _seen | {(path, name)}
        tree = self.parse(path)
        if tree is None:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return path, node
        for holder in ([scope] if scope is not None else []) + [tree]:
            for imp in _imports(holder):
                for alias in imp.names:
                    if (alias.asname or alias.name) != name:
                        continue
                    target = self.module_path(_absolute(path, imp))
                    if target is None:  # `from package import module`? not a class
                        continue
                    found = self.find_class(target, alias.name, None, seen)
                    if found is not None:
                        return found
        return None


def _imports(holder: ast.AST):
    """``from ... import`` statements of a module or function body, not of nested functions or classes."""
    stack = list(getattr(holder, "body", []))
    while stack:
        node = stack.pop(0)
        if isinstance(node, ast.ImportFrom):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            stack[:0] = [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                         *[s for h in getattr(node, "handlers", []) for s in h.body]]


def _absolute(path: str, imp: ast.ImportFrom) -> str:
    if not imp.level:
        return imp.module or ""
    package = path.split("/")[:-1]
    package = package[: len(package) - (imp.level - 1)]
    return ".".join(package + ([imp.module] if imp.module else []))


def _git(root: Path, *args: str, strip: bool = True) -> str | None:
    proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() if strip else proc.stdout
