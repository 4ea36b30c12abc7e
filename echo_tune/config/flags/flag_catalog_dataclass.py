"""The flags Megatron-LM generates from config dataclasses, read from their source by AST.

This reproduces ``ArgumentGroupFactory`` of NVIDIA/Megatron-LM megatron/training/argument_utils.py at
commit d98e8a64ddf3: every dataclass field (base classes' first, as ``dataclasses.fields`` orders them)
that is not excluded and not ``init=False`` becomes ``--<name with - for _>``; ``Optional[X]`` is read
as ``X``, ``list[X]`` gives ``nargs="+"``, ``Literal[...]`` and enums give choices (enum member names:
the type handler is ``Enum[cli_arg]``); a ``bool`` becomes ``store_true`` when its default ``== False``
and otherwise ``store_false`` spelled ``--no-<name>`` and ``--disable-<name>``; finally the field's
``metadata["argparse_meta"]`` overrides any of it (``arg_names``, ``dest``, ``nargs``, ``action``, ...).
"""

from __future__ import annotations

import ast

from echo_tune.config.flags.flag_catalog_source import UNKNOWN, SourceTree, literal

_NO_VALUE_ACTIONS = ("store_true", "store_false", "store_const", "count", "append_const", "help", "version",
                     "BooleanOptionalAction")


def takes_value(action: str | None) -> bool:
    return action not in _NO_VALUE_ACTIONS


def dataclass_arguments(tree: SourceTree, path: str, cls: ast.ClassDef, exclude: set[str],
                        origin: str, warn) -> list[dict]:
    """The arguments ``ArgumentGroupFactory(cls, exclude=exclude).build_group`` adds, in order."""
    out = []
    for name, spec in _fields(tree, path, cls).items():
        if name in exclude or spec["init"] is False:
            continue
        out.append(_argument(tree, spec, f"{origin}.{name}", warn))
    return out


def _fields(tree: SourceTree, path: str, cls: ast.ClassDef) -> dict[str, dict]:
    """``dataclasses.fields`` order: base classes' fields first (a redefinition keeps its place)."""
    fields: dict[str, dict] = {}
    for base in reversed(cls.bases):
        if isinstance(base, ast.Name):
            found = tree.find_class(path, base.id)
            if found is not None:
                fields.update(_fields(tree, *found))
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = ast.unparse(node.annotation)
        if annotation.startswith(("ClassVar", "typing.ClassVar", "InitVar", "dataclasses.InitVar", "KW_ONLY")):
            continue
        spec = {"name": node.target.id, "annotation": node.annotation, "path": path, "init": True,
                "default": UNKNOWN if node.value is not None else _MISSING, "meta": {}}
        value = node.value
        if isinstance(value, ast.Call) and ast.unparse(value.func) in ("field", "dataclasses.field"):
            spec["default"] = _MISSING
            for kw in value.keywords:
                if kw.arg == "default":
                    spec["default"] = literal(kw.value)
                elif kw.arg == "init":
                    spec["init"] = literal(kw.value)
                elif kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                    spec["meta"] = _argparse_meta(kw.value)
        elif value is not None:
            spec["default"] = literal(value)
        fields[spec["name"]] = spec
    return fields


_MISSING = object()  # no default, or a default_factory: never == False


def _argparse_meta(metadata: ast.Dict) -> dict:
    for key, value in zip(metadata.keys, metadata.values):
        if literal(key) == "argparse_meta" and isinstance(value, ast.Dict):
            return {literal(k): v for k, v in zip(value.keys, value.values)}
    return {}


def _argument(tree: SourceTree, spec: dict, origin: str, warn) -> dict:
    name = spec["name"]
    arg = {"names": [_flag(name)], "dest": name, "origin": origin}
    kind = _extract(tree, spec["path"], spec["annotation"])
    if kind is None and not spec["meta"]:
        warn(f"{origin}: type {ast.unparse(spec['annotation'])} is not one argparse takes and no argparse_meta")
    kind = kind or {}
    if kind.get("type") == "bool":
        default = spec["default"]
        if default is UNKNOWN:
            warn(f"{origin}: bool default is not a literal; read as not False (store_false)")
        arg["action"] = "store_true" if default is not _MISSING and default is not UNKNOWN \
            and default == False else "store_false"  # noqa: E712 (Megatron compares with ==)
        if arg["action"] == "store_false":
            arg["names"] = [_flag(name, "no"), _flag(name, "disable")]
    for key in ("nargs", "choices"):
        if key in kind:
            arg[key] = kind[key]
    meta = spec["meta"]
    for key in ("arg_names", "dest", "nargs", "choices", "action"):
        if key in meta:
            value = literal(meta[key])
            if value is UNKNOWN:
                warn(f"{origin}: argparse_meta[{key!r}] is not a literal")
                continue
            arg["names" if key == "arg_names" else key] = list(value) if key == "arg_names" else value
    return arg


def _flag(name: str, prefix: str | None = None) -> str:
    return "--" + ((prefix + "_" + name) if prefix else name).replace("_", "-")


def _extract(tree: SourceTree, path: str, node: ast.AST) -> dict | None:
    """``ArgumentGroupFactory._extract_type`` on an annotation node: {"type", "nargs", "choices"} or None
    where Megatron raises TypeInferenceError (a non-Optional Union, a tuple, a Callable, ...)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
        return _extract(tree, path, ast.parse(node.value, mode="eval").body)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):  # X | Y
        members = [node.left, node.right]
        return _extract(tree, path, members[0]) if _is_none(members[1]) else None
    if isinstance(node, ast.Subscript):
        origin = ast.unparse(node.value).split(".")[-1]
        args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        if origin == "Optional":
            return _extract(tree, path, args[0])
        if origin == "Union":
            return _extract(tree, path, args[0]) if len(args) > 1 and _is_none(args[1]) else None
        if origin in ("list", "List"):
            inner = _extract(tree, path, args[0]) if len(args) == 1 else None
            return None if inner is None else {**inner, "nargs": "+"}
        if origin == "Literal":
            return {"type": type(literal(args[0])).__name__, "choices": [literal(a) for a in args]}
        return None
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = ast.unparse(node)
        if isinstance(node, ast.Name):
            found = tree.find_class(path, name)
            if found is not None and _is_enum(tree, *found):
                return {"type": "enum", "choices": _enum_members(found[1])}
        return {"type": name}
    return None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _is_enum(tree: SourceTree, path: str, cls: ast.ClassDef) -> bool:
    for base in cls.bases:
        name = ast.unparse(base).split(".")[-1]
        if name in ("Enum", "IntEnum", "StrEnum", "Flag", "IntFlag"):
            return True
        found = tree.find_class(path, name) if isinstance(base, ast.Name) else None
        if found is not None and _is_enum(tree, *found):
            return True
    return False


def _enum_members(cls: ast.ClassDef) -> list[str]:
    return [t.id for node in cls.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name) and not t.id.startswith("_")]
