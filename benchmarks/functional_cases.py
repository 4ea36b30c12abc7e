"""The Megatron-LM functional-test corpus (benchmarks/data/megatron_functional_tests/) as runnable cases.

A case's MODEL_ARGS become the launch line Megatron's CI builds from them
(tests/functional_tests/shell_test_utils/_run_training.sh, Megatron-LM d98e8a64ddf3: ``true`` -> the bare
flag, an empty value -> left out, a value written ``"[a b]"`` -> its words, a list -> its values, other
values one shell word); ``false`` is left out (a store_true flag off).
``${VAR}`` paths stay as placeholders (they only name files); a path into Megatron-LM's tree that a flag reads
(``--tp-comm-overlap-cfg``) points at its copy under ``files/``, as the CI runs from the repository root. Each
golden platform is matched to an
echo-tune cluster preset and to the GPU count of the recipe that runs the case there.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parent / "data" / "megatron_functional_tests"
FILES = DATA / "files"
"""Files of Megatron-LM's tree that case flags read, copied at the corpus commit (their paths kept)."""
SETS = ("gpt", "moe")
# golden platform -> echo-tune cluster preset (`echo-tune presets clusters`). dracooci / dgxc: the same
# DGX A100 / H100 systems hosted in Oracle Cloud and DGX Cloud.
PLATFORM_CLUSTERS = {"dgx_h100": "h100-sxm", "dgxh100_dgxc": "h100-sxm", "dgx_a100": "a100-80gb",
                     "dgxa100_dracooci": "a100-80gb", "dgxa100_dracooci-ord": "a100-80gb",
                     "dgx_gb200": "gb200-nvl72"}
# recipe platform that stands for a golden platform when looking the GPU count up
RECIPE_PLATFORM = {"dgxh100_dgxc": "dgx_h100", "dgxa100_dracooci": "dgx_a100", "dgxa100_dracooci-ord": "dgx_a100"}
PRIMARY_ORDER = ("h100-sxm", "a100-80gb", "gb200-nvl72")  # the platform a case's outcome is read on


@dataclasses.dataclass(frozen=True, kw_only=True)
class Run:
    """One case on one golden platform: what to simulate and what was measured."""

    set_name: str
    case: str
    platform: str
    cluster: str
    num_gpus: int
    gpus_source: str
    line: str
    golden: dict


def launch_line(model_args: dict) -> str:
    """MODEL_ARGS -> one shell line of Megatron flags (see the module docstring)."""
    tokens: list[str] = []
    for flag, value in model_args.items():
        if value is True:
            tokens.append(flag)
        elif value is False or value is None or value == "":
            continue
        elif isinstance(value, list):
            tokens += [flag, *(shlex.quote(str(v)) for v in value)]
        elif isinstance(value, str) and re.fullmatch(r"\[[^]]+\]", value.strip()):
            tokens += [flag, *(shlex.quote(v) for v in value.strip()[1:-1].split())]
        else:
            copied = FILES / str(value)
            tokens += [flag, shlex.quote(str(copied) if isinstance(value, str) and copied.is_file() else str(value))]
    return " ".join(tokens)


def out_of_scope(case: str) -> str | None:
    """Why a case is out of scope for a training-step simulator, by its name: inference (static, dynamic,
    offline) or reinforcement learning (GRPO: rollouts by inference between training steps, train_rl.py)."""
    if "inference" in case:
        return "inference"
    if "grpo" in case:
        return "rl"
    return None


def load_corpus(data_dir: Path = DATA) -> dict[str, dict]:
    """Set name -> the YAML content (source_commit, default_recipes, cases)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return {name: yaml.load((data_dir / f"{name}.yaml").read_text(), Loader=loader) for name in SETS}


def gpus_for(case: dict, defaults: list[dict], platform: str) -> tuple[int, str]:
    """GPUs of the recipe that runs the case on ``platform`` (nodes x GPUs per node), and where it came from:
    the case's own GPUS_PER_NODE for its first block when it states one, else a recipe listing that platform,
    else one in the same recipe folder, else the set's main recipe."""
    if "model_args_gpus_per_node" in case:  # the case states it (MODEL_ENV_VARS): one node of that many
        return case["model_args_gpus_per_node"], "the case's MODEL_ENV_VARS.MODEL_ARGS.GPUS_PER_NODE"
    wanted = RECIPE_PLATFORM.get(platform, platform)
    family = "gb200/" if wanted == "dgx_gb200" else "h100/"
    recipes = case.get("recipes") or []
    for pick, source in (([r for r in recipes if wanted in r["platforms"]], "recipe"),
                         ([r for r in recipes if r["recipe"].startswith(family)], "recipe (other platform)"),
                         ([r for r in defaults if wanted in r["platforms"]], "default (no recipe lists the case)")):
        if pick:
            return pick[0]["nodes"] * pick[0]["gpus_per_node"], f"{source}: {pick[0]['recipe']}"
    raise ValueError(f"no recipe for platform {platform!r}")


def case_runs(set_name: str, name: str, case: dict, defaults: list[dict]) -> list[Run]:
    """The case's runs, one per golden platform with a cluster preset (first runs, dev before lts), the
    primary platform (H100, else A100, else GB200) first. A case without goldens gets one H100 run."""
    line = launch_line(case["model_args"])
    by_cluster: dict[str, tuple[str, dict]] = {}
    goldens = sorted((g for g in case.get("golden") or [] if not g.get("second_run") and not g.get("empty")),
                     key=lambda g: g["environment"] != "dev")
    for golden in goldens:
        cluster = PLATFORM_CLUSTERS.get(golden.get("platform") or "")
        if cluster is not None and cluster not in by_cluster:
            by_cluster[cluster] = (golden["platform"], golden)
    if not by_cluster:
        by_cluster["h100-sxm"] = ("dgx_h100", {})
    runs = []
    for cluster in sorted(by_cluster, key=PRIMARY_ORDER.index):
        platform, golden = by_cluster[cluster]
        num_gpus, source = gpus_for(case, defaults, platform)
        runs.append(Run(set_name=set_name, case=name, platform=platform, cluster=cluster, num_gpus=num_gpus,
                        gpus_source=source, line=line, golden=golden))
    return runs


def corpus_runs(corpus: dict[str, dict] | None = None, names: list[str] | None = None
                ) -> tuple[dict[str, list[Run]], dict[str, list[str]]]:
    """(training case ``set/name`` -> its runs, reason -> the cases left out of scope). ``names`` keeps only
    those cases (``set/name`` or ``name``; a name can be in both sets)."""
    corpus = load_corpus() if corpus is None else corpus
    runs: dict[str, list[Run]] = {}
    left_out: dict[str, list[str]] = {}
    for set_name, content in corpus.items():
        for name, case in content["cases"].items():
            key = f"{set_name}/{name}"
            if names is not None and name not in names and key not in names:
                continue
            if out_of_scope(name):
                left_out.setdefault(out_of_scope(name), []).append(key)
                continue
            runs[key] = case_runs(set_name, name, case, content["default_recipes"])
    return runs, left_out
