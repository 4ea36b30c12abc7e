"""Write the list of every Megatron-LM command-line flag (config/data/megatron_flags.json) from its source.

    python -m echo_tune.config.flags.flag_catalog_build --megatron /path/to/Megatron-LM            # a checkout
    python -m echo_tune.config.flags.flag_catalog_build --megatron /path/to/repo.git --commit d98e8a64ddf3

Read by AST, nothing imported: NVIDIA/Megatron-LM megatron/training/arguments.py, the functions
``add_megatron_arguments`` calls (every ``add_argument`` option string, its ``action`` -- argparse's
``BooleanOptionalAction`` adds ``--no-<flag>`` --, ``nargs``, ``choices`` and ``dest``, which argparse
takes from the first long option string with ``-`` turned into ``_`` when not given), and the flags of
every ``ArgumentGroupFactory(<dataclass>, exclude=...)`` there (TransformerConfig with its base
ModelParallelConfig, TrainingConfig, CheckpointConfig, LoggerConfig, ... -- see
config/flags/flag_catalog_dataclass.py); plus megatron/post_training/arguments.py ``add_modelopt_args``, which
pretrain_gpt.py adds when nvidia-modelopt is installed. The parser has ``allow_abbrev=False``, so these
exact option strings are what Megatron accepts. The checked-in file is for commit d98e8a64ddf3.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

from echo_tune.config.flags.flag_catalog_dataclass import dataclass_arguments, takes_value
from echo_tune.config.flags.flag_catalog_source import UNKNOWN, SourceTree, literal

DATA = Path(__file__).parent.parent / "data" / "megatron_flags.json"
ENTRY_POINTS = (("megatron/training/arguments.py", "add_megatron_arguments"),
                ("megatron/post_training/arguments.py", "add_modelopt_args"))
"""(file, function): the parser-building functions whose flags pretrain_gpt.py accepts."""


def build_catalog(tree: SourceTree, warn=lambda msg: print(f"warning: {msg}", file=sys.stderr)) -> dict:
    """{"commit", "sources", "flags": {option string: {dest, takes_value, action?, nargs?, choices?,
    aliases?, deprecated?, origin}}} of a Megatron-LM tree."""
    flags: dict[str, dict] = {}
    for path, entry in ENTRY_POINTS:
        module = tree.parse(path)
        if module is None:
            warn(f"{path} is not in the tree; its flags are left out")
            continue
        for argument in _arguments(tree, path, module, entry, warn):
            names = argument.pop("names")
            for name in names:
                if name in flags:
                    warn(f"{name} is defined twice ({flags[name]['origin']}, {argument['origin']})")
                    continue
                entry_ = {"dest": argument["dest"], "takes_value": takes_value(argument.get("action"))}
                entry_ |= {k: argument[k] for k in ("action", "nargs", "choices") if k in argument}
                others = [n for n in names if n != name]
                entry_ |= {"aliases": others} if others else {}
                entry_ |= {"deprecated": True} if argument.get("deprecated") else {}
                flags[name] = entry_ | {"origin": argument["origin"]}
    return {"commit": tree.commit, "sources": [f"{p}:{f}" for p, f in ENTRY_POINTS],
            "flags": dict(sorted(flags.items()))}


def _arguments(tree: SourceTree, path: str, module: ast.Module, entry: str, warn) -> list[dict]:
    functions = {n.name: n for n in module.body if isinstance(n, ast.FunctionDef)}
    reached, todo = [], [entry]
    while todo:  # the module's functions that the entry point calls, transitively
        name = todo.pop(0)
        if name in reached or name not in functions:
            continue
        reached.append(name)
        todo += [c.func.id for c in ast.walk(functions[name])
                 if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)]
    out = []
    for name in reached:
        function = functions[name]
        origin = f"{path.split('megatron/', 1)[-1]}:{name}"
        for call in sorted((c for c in ast.walk(function) if isinstance(c, ast.Call)), key=lambda c: c.lineno):
            callee = ast.unparse(call.func)
            if callee.endswith(".add_argument"):
                out.append(_manual(call, origin, warn))
            elif callee == "ArgumentGroupFactory":
                out += _factory(tree, path, function, call, warn)
    return out


def _manual(call: ast.Call, origin: str, warn) -> dict:
    """One ``add_argument`` call as argparse reads it."""
    names = [literal(a) for a in call.args]
    if UNKNOWN in names:
        warn(f"{origin}: add_argument with a computed option string: {ast.unparse(call)[:80]}")
        names = [n for n in names if n is not UNKNOWN]
    kw = {k.arg: k.value for k in call.keywords}
    long = [n for n in names if n.startswith("--")] or names
    arg = {"names": names, "dest": long[0].lstrip("-").replace("-", "_") if long else "?", "origin": origin}
    if "dest" in kw:
        arg["dest"] = literal(kw["dest"])
    if "action" in kw:
        action = literal(kw["action"])
        arg["action"] = ast.unparse(kw["action"]).split(".")[-1] if action is UNKNOWN else action
        if arg["action"] == "BooleanOptionalAction":  # argparse adds --no-<flag> for every --<flag>
            arg["names"] = names + ["--no-" + n[2:] for n in names if n.startswith("--")]
    for key in ("nargs", "choices"):
        if key in kw:
            value = literal(kw[key])
            if value is UNKNOWN:
                warn(f"{origin} {names[0]}: {key} is not a literal ({ast.unparse(kw[key])[:60]})")
            else:
                arg[key] = list(value) if key == "choices" else value
    help_text = literal(kw.get("help"))
    arg["deprecated"] = "deprecated" in str(arg["dest"]) or (
        isinstance(help_text, str) and "deprecat" in help_text.lower())
    return arg


def _factory(tree: SourceTree, path: str, function: ast.FunctionDef, call: ast.Call, warn) -> list[dict]:
    """The arguments of ``ArgumentGroupFactory(Class, exclude=...)`` (exclude a list, or a local name)."""
    if not call.args or not isinstance(call.args[0], ast.Name):
        warn(f"{path}:{call.lineno}: ArgumentGroupFactory of a non-name: {ast.unparse(call)[:80]}")
        return []
    exclude_node = next((k.value for k in call.keywords if k.arg == "exclude"), None)
    if len(call.args) > 1:
        exclude_node = call.args[1]
    if isinstance(exclude_node, ast.Name):  # the last assignment to that name in the function
        exclude_node = next((n.value for n in reversed(list(ast.walk(function))) if isinstance(n, ast.Assign)
                             and any(isinstance(t, ast.Name) and t.id == exclude_node.id for t in n.targets)), None)
    exclude = set() if exclude_node is None else literal(exclude_node)
    if exclude is UNKNOWN:
        warn(f"{path}:{call.lineno}: exclude list is not a literal; nothing excluded")
        exclude = set()
    class_name = call.args[0].id
    found = tree.find_class(path, class_name, scope=function)
    if found is None:
        warn(f"{path}:{call.lineno}: class {class_name} not found in the tree; its flags are left out")
        return []
    return dataclass_arguments(tree, *found, set(exclude), class_name, warn)


def dump(catalog: dict) -> str:
    """JSON with one flag per line (readable diffs when Megatron-LM is updated)."""
    head = {k: v for k, v in catalog.items() if k != "flags"}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    rows = [f"  {json.dumps(name)}: {json.dumps(entry)}" for name, entry in catalog["flags"].items()]
    return "{\n" + "\n".join(lines) + '\n "flags": {\n' + ",\n".join(rows) + "\n }\n}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron", required=True, help="a Megatron-LM checkout, or a git directory")
    parser.add_argument("--commit", default=None, help="the commit to read (a git directory; default HEAD)")
    parser.add_argument("--out", type=Path, default=DATA, help=f"where to write (default {DATA})")
    args = parser.parse_args(argv)
    catalog = build_catalog(SourceTree.open(args.megatron, args.commit))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(dump(catalog))
    print(f"{len(catalog['flags'])} flags of Megatron-LM {catalog['commit'][:12]} -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
