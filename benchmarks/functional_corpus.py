"""Rebuild benchmarks/data/megatron_functional_tests/ from a Megatron-LM checkout.

For every case of ``tests/functional_tests/test_cases/{gpt,moe}/*``: its MODEL_ARGS and ENV_VARS as
written in ``model_config.yaml``, the recipes (``tests/test_utils/recipes/*/*.yaml``) that run it with
their nodes and GPUs per node, and from each ``golden_values_*.json`` the figures that matter for a step
simulator (steady iteration-time median, memory after the first step and its peak), not the raw series.

    python benchmarks/functional_corpus.py --megatron PATH [--commit SHA] [--out DIR]

PATH is a checkout (or ``git archive`` extract) of NVIDIA/Megatron-LM; the corpus in the repo was built
from commit d98e8a64ddf3 (see the README next to it). Without ``--commit`` the commit is read with
``git -C PATH rev-parse HEAD``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

SETS = ("gpt", "moe")
OUT = Path(__file__).resolve().parent / "data" / "megatron_functional_tests"
GOLDEN_NAME = re.compile(r"golden_values_(?P<env>[a-z]+)(?:_(?P<platform>.+?))?(?P<second>_2nd)?\.json$")
MEMORY_METRICS = ("mem-allocated-bytes", "mem-max-allocated-bytes")


def _finite(values: dict) -> dict[int, float]:
    """Step -> value of a golden series, NaNs (logged as the string "nan") dropped."""
    out = {}
    for step, value in values.items():
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[int(step)] = float(value)
    return dict(sorted(out.items()))


def steady_iteration_steps(steps: list[int]) -> list[int]:
    """The steps Megatron's own CI compares iteration time over: 5..20 for runs up to step 25, else 30..45,
    else the first four finite steps past the window start (tests/functional_tests/python_test_utils/
    common.py, Megatron-LM d98e8a64ddf3)."""
    if not steps:
        return []
    window = range(5, 21) if steps[-1] <= 25 else range(30, 46)
    chosen = [s for s in steps if s in window]
    return chosen or [s for s in steps if s >= window.start][:4]


def golden_summary(data: dict) -> dict:
    """The compact figures of one golden_values file (absent metrics are left out)."""
    out: dict = {}
    series = data.get("iteration-time")
    if isinstance(series, dict) and isinstance(series.get("values"), dict):
        finite = _finite(series["values"])
        steps = steady_iteration_steps(list(finite))
        if steps:
            out["iteration_time_s_median"] = round(statistics.median(finite[s] for s in steps), 6)
            out["iteration_time_steps"] = [steps[0], steps[-1], len(steps)]
    for metric in MEMORY_METRICS:
        series = data.get(metric)
        if isinstance(series, dict) and isinstance(series.get("values"), dict):
            finite = _finite(series["values"])
            if finite:
                key = metric.replace("-", "_")
                first = next(iter(finite))
                out[f"{key}_first"] = int(finite[first])  # logged after the first step (training.py)
                out[f"{key}_first_step"] = first
                out[f"{key}_max"] = int(max(finite.values()))
        elif isinstance(series, (int, float)):  # inference goldens store one number
            out[f"{metric.replace('-', '_')}_max"] = int(series)
    return out


def read_goldens(case_dir: Path) -> list[dict]:
    rows = []
    for path in sorted(case_dir.glob("golden_values_*.json")):
        match = GOLDEN_NAME.match(path.name)
        if match is None:
            continue
        text = path.read_text()
        row = {"file": path.name, "environment": match["env"], "platform": match["platform"],
               "second_run": bool(match["second"])}
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError:
            data = {}
        if not data:
            row["empty"] = True
        row |= golden_summary(data) if isinstance(data, dict) else {}
        rows.append(row)
    return rows


def read_recipes(recipes_dir: Path) -> dict[tuple[str, str], list[dict]]:
    """(model, test case) -> the recipes that run it: file, nodes, GPUs per node, platforms, environments."""
    out: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(recipes_dir.glob("*/*.yaml")):
        recipe = yaml.safe_load(path.read_text()) or {}
        spec = recipe.get("spec") or {}
        if spec.get("model") not in SETS:
            continue
        for group in recipe.get("products") or []:
            platforms, environments = set(), set()
            for product in group.get("products") or [{}]:
                platforms |= set(_as_list(product.get("platforms", spec.get("platforms"))))
                environments |= set(_as_list(product.get("environment")))
            for case in _as_list(group.get("test_case")):
                out.setdefault((spec["model"], case), []).append({
                    "recipe": str(path.relative_to(recipes_dir)), "nodes": int(spec["nodes"]),
                    "gpus_per_node": int(spec["gpus"]), "platforms": sorted(platforms),
                    "environments": sorted(environments)})
    return out


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, list) else [value]


def read_case(case_dir: Path) -> dict:
    config = yaml.safe_load((case_dir / "model_config.yaml").read_text()) or {}
    case = {"model_args": config.get("MODEL_ARGS") or {}}
    if config.get("ENV_VARS"):
        case["env_vars"] = config["ENV_VARS"]
    for key in ("TEST_TYPE", "MODE"):
        if key in config:
            case[key.lower()] = config[key]
    if "MODEL_ARGS_2" in config:
        case["has_model_args_2"] = True
    # the case's own GPU count for its first block (Megatron's launcher reads MODEL_ENV_VARS.MODEL_ARGS)
    gpus = ((config.get("MODEL_ENV_VARS") or {}).get("MODEL_ARGS") or {}).get("GPUS_PER_NODE")
    if gpus is not None:
        case["model_args_gpus_per_node"] = int(gpus)
    return case


def default_recipes(recipes_dir: Path, name: str) -> list[dict]:
    """The nodes and GPUs per node of the set's main recipes (``h100/gpt.yaml``, ``gb200/gpt.yaml``): what a
    case that no recipe lists at this commit would run on, for its golden platform."""
    out = []
    for path in sorted(recipes_dir.glob(f"*/{name}.yaml")):
        spec = (yaml.safe_load(path.read_text()) or {}).get("spec") or {}
        platforms = ["dgx_gb200"] if path.parent.name == "gb200" else ["dgx_a100", "dgx_h100"]
        out.append({"recipe": str(path.relative_to(recipes_dir)), "nodes": int(spec["nodes"]),
                    "gpus_per_node": int(spec["gpus"]), "platforms": platforms})
    return out


def build(megatron: Path) -> dict[str, dict]:
    cases_root = megatron / "tests" / "functional_tests" / "test_cases"
    recipes_dir = megatron / "tests" / "test_utils" / "recipes"
    recipes = read_recipes(recipes_dir)
    corpus: dict[str, dict] = {}
    for name in SETS:
        cases = {}
        for case_dir in sorted(p for p in (cases_root / name).iterdir() if (p / "model_config.yaml").exists()):
            case = read_case(case_dir)
            case["recipes"] = recipes.get((name, case_dir.name), [])
            case["golden"] = read_goldens(case_dir)
            cases[case_dir.name] = case
        corpus[name] = {"default_recipes": default_recipes(recipes_dir, name), "cases": cases}
    return corpus


def commit_of(megatron: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(megatron), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        sys.exit(f"{megatron} is not a git checkout; give its commit with --commit SHA")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megatron", required=True, type=Path, help="Megatron-LM checkout")
    parser.add_argument("--commit", help="its commit (default: git rev-parse HEAD in --megatron)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"output folder (default {OUT})")
    args = parser.parse_args(argv)
    commit = args.commit or commit_of(args.megatron)
    corpus = build(args.megatron)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, content in corpus.items():
        header = (f"# Megatron-LM {commit} tests/functional_tests/test_cases/{name}: MODEL_ARGS and ENV_VARS as\n"
                  f"# written, recipes (tests/test_utils/recipes) and golden-value summaries. Rebuild with\n"
                  f"# python benchmarks/functional_corpus.py --megatron PATH (see README.md).\n")
        body = yaml.safe_dump({"source_commit": commit, **content}, sort_keys=False, width=120)
        (args.out / f"{name}.yaml").write_text(header + body)
        print(f"{name}: {len(content['cases'])} cases -> {args.out / (name + '.yaml')}")


if __name__ == "__main__":
    main()
