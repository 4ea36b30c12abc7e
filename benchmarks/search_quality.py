"""Search quality of the default search (``auto``) against the exhaustive optimum: not a test, a measurement.

Per space: valid layouts, the exhaustive optimum (``--sampler exhaustive``) and its wall time, and for each
seed the default search's best step time, its gap to the optimum, layouts simulated and wall time (both
through ``run_search``, enumeration included, one process). Spaces:

  * llama3.1-70b   - Llama-3.1 70B, 256 H100, global batch 512 (zero-YAML space)
  * gpt3-175b      - search_spaces/gpt3-175b-1024xa100.yaml
  * mixtral-8x7b   - search_spaces/mixtral-8x7b-64xh100.yaml
  * qwen3-30b-a3b-16-recipes - Qwen3-30B-A3B, 16 H100, global batch 512, sequence 4096, FP8 auto, the recipe
                     features on (dispatcher, EP overlap, delayed wgrad, recompute modules, FP8 recipe), CP 1 and
                     micro-batch 1-2
  * qwen3-30b-a3b (not run by default) - Qwen3-30B-A3B, 256 H100, global batch 1024, sequence 4096 (the zero-YAML
                     space of ``echo-tune search --model qwen3-30b-a3b --cluster h100 --num-gpus 256 ...``); with the
                     recipe features it holds more layouts than an exhaustive search takes (MAX_VALID_LAYOUTS), as do
                     deepseek-v3 and, likely, the other MoE zero-YAML spaces below
  * mixtral-8x22b, deepseek-v2-lite (not run by default) - zero-YAML: 256 H100, global batch 1024; 64 H100, 512
  * deepseek-v3 (not run by default) - DeepSeek-V3, 1024 H100, global batch 8192 (the Megatron-Bridge 25.09
                     DeepSeek-V3 row of runs_bridge.csv), sequence 4096; uneven pipeline splits searched
  * mixtral-8x22b-b200 (not run by default) - Mixtral 8x22B, 256 B200, global batch 1024
  * qwen3-235b-a22b-256-recipes, deepseek-v3-1024-recipes (not run by default) - issue 38's other two jobs (256 H100,
                     global batch 2048; 1024 H100, 8192), sequence 4096, FP8 auto, the recipe features on, CP 1 and
                     micro-batch 1

    python benchmarks/search_quality.py [--spaces qwen3-30b-a3b,llama3.1-70b,...] [--seeds 5] [--n-trials N]
        [--compare tpe] [--exhaustive-jobs 1,2] [--results-dir DIR] [--json]

``--exhaustive-jobs``: the exhaustive search is run once per process count listed (each its own study), so
one run measures 1 against 2 processes on the same space.

``--compare tpe`` adds the same seeds of another sampler at its default trials (TPE: 200).
``--results-dir`` keeps the studies: a second run reuses a finished exhaustive study (resumed, nothing new
to simulate) and times only the default searches; a study of other code (any edit under echo_tune/) is refused
(search/storage/content.py): use a fresh folder then. The default searches take no random draw (auto.py), so
every seed gives the same layouts; the seeds are run to show that.
``--stored-exhaustive`` takes the optimum, layout count and simulated count from the exhaustive study kept in
``--results-dir`` (its journal read line by line: stored_study.py) instead of running it: no content check, so
valid only while the simulator and the space are those of the study (a change under search/engines/ only, say).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from echo_tune.search import SearchOptions, load_space, run_search  # noqa: E402
from stored_study import exhaustive_journal, read_study  # noqa: E402

ZERO_YAML = {
    "qwen3-30b-a3b": dict(model="qwen3-30b-a3b", cluster="h100", num_gpus=256, global_batch_size=1024,
                          seq_length=4096),
    "llama3.1-70b": dict(model="llama3.1-70b", cluster="h100", num_gpus=256, global_batch_size=512),
    "mixtral-8x22b": dict(model="mixtral-8x22b", cluster="h100", num_gpus=256, global_batch_size=1024),
    "deepseek-v2-lite": dict(model="deepseek-v2-lite", cluster="h100", num_gpus=64, global_batch_size=512),
    "deepseek-v3": dict(model="deepseek-v3", cluster="h100", num_gpus=1024, global_batch_size=8192, seq_length=4096),
    "mixtral-8x22b-b200": dict(model="mixtral-8x22b", cluster="b200", num_gpus=256, global_batch_size=1024),
    # the recipe features on (search/space/recipe_defaults.py), CP and micro-batch narrowed so that the exhaustive
    # optimum takes minutes on the 2-core machine: the feature level against every combination
    "qwen3-30b-a3b-16-recipes": dict(model="qwen3-30b-a3b", cluster="h100", num_gpus=16, global_batch_size=512,
                                     seq_length=4096, fp8_format="auto",
                                     layout={"context_parallel_size": 1, "micro_batch_size": [1, 2]}),
    # issue 38's other two jobs with the recipe features on and FP8 auto, CP 1 and micro-batch 1 (the recipes' own)
    "qwen3-235b-a22b-256-recipes": dict(model="qwen3-235b-a22b", cluster="h100", num_gpus=256, global_batch_size=2048,
                                        seq_length=4096, fp8_format="auto",
                                        layout={"context_parallel_size": 1, "micro_batch_size": 1}),
    "deepseek-v3-1024-recipes": dict(model="deepseek-v3", cluster="h100", num_gpus=1024, global_batch_size=8192,
                                     seq_length=4096, fp8_format="auto",
                                     layout={"context_parallel_size": 1, "micro_batch_size": 1}),
}
FILES = {"gpt3-175b": REPO / "search_spaces" / "gpt3-175b-1024xa100.yaml",
         "mixtral-8x7b": REPO / "search_spaces" / "mixtral-8x7b-64xh100.yaml"}


def build(name: str):
    if name in FILES:
        return load_space(FILES[name])
    from echo_tune.search.space.auto_space import auto_space

    return auto_space(**ZERO_YAML[name])


def measure(name: str, seeds: int, n_trials: int | None, results: Path, samplers: tuple[str, ...] = ("auto",),
            jobs: tuple[int, ...] = (1,), stored: bool = False) -> dict:
    space = build(name)
    row = {"space": name, "exhaustive": [], "runs": []}
    if stored:  # the optimum of a kept exhaustive study, read as stored (module docstring)
        study = read_study(exhaustive_journal(results, space.name))
        row["exhaustive"].append({"n_jobs": None, "new_trials": 0, "simulated": study.simulated, "wall_s": None})
        row["layouts"], row["optimum_s"] = study.layouts, study.optimum_s
        jobs = ()
    for n_jobs in jobs:
        start = time.perf_counter()
        exhaustive = run_search(space, SearchOptions(sampler="exhaustive", n_jobs=n_jobs, resume=True,
                                                     study_name=f"{space.name}-exhaustive-{n_jobs}",
                                                     results_dir=results, write_files=False))
        row["exhaustive"].append({"n_jobs": n_jobs, "new_trials": exhaustive.new_trials,
                                  "simulated": exhaustive.n_simulated, "wall_s": time.perf_counter() - start})
        row["layouts"], row["optimum_s"] = exhaustive.space_size, exhaustive.best["step_time_s"]
    for sampler in samplers:
        for seed in range(seeds):
            start = time.perf_counter()
            opts = SearchOptions(sampler=sampler, seed=seed, n_trials=n_trials if sampler == "auto" else None,
                                 study_name=f"{space.name}-{sampler}-{seed}", results_dir=results, overwrite=True,
                                 write_files=False)
            result = run_search(space, opts)
            best = result.best["step_time_s"] if result.best else float("inf")
            row["runs"].append({"sampler": sampler, "seed": seed, "best_s": best,
                                "gap_pct": 100 * (best / row["optimum_s"] - 1), "covered": result.n_trials,
                                "simulated": result.n_simulated,
                                "coverage": result.coverage, "wall_s": time.perf_counter() - start})
    return row


def print_table(rows: list[dict]) -> None:
    print("| space | layouts | exhaustive optimum | exhaustive wall (simulated) | search | seed | best | gap | covered "
          "(coverage) | simulated | wall |")
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        ex_wall = ", ".join(f"{e['wall_s']:.1f} s ({e['n_jobs']} job{'s' if e['n_jobs'] > 1 else ''})"
                            if e["new_trials"] else "(stored)" if e["n_jobs"] is None else f"(stored, {e['n_jobs']})"
                            for e in row["exhaustive"])
        simulated = row["exhaustive"][-1].get("simulated", row["layouts"])
        for i, run in enumerate(row["runs"]):
            head = (f"| {row['space']} | {row['layouts']} | {row['optimum_s']:.4f} s | {ex_wall} ({simulated}) "
                    if i == 0 else "| | | | ")
            sampler = "default" if run["sampler"] == "auto" else run["sampler"]
            print(f"{head}| {sampler} | {run['seed']} | {run['best_s']:.4f} s | {run['gap_pct']:.2f}% | {run['covered']} "
                  f"({100 * run['coverage']:.1f}%) | {run['simulated']} | {run['wall_s']:.1f} s |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spaces", default="llama3.1-70b,gpt3-175b,mixtral-8x7b,qwen3-30b-a3b-16-recipes")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--n-trials", type=int, default=None, help="the default search's budget (default: its own)")
    parser.add_argument("--compare", default="", help="also run these samplers at their default trials, e.g. tpe")
    parser.add_argument("--exhaustive-jobs", default="1", help="process counts of the exhaustive runs, e.g. 1,2")
    parser.add_argument("--results-dir", default=None, help="keep the studies here (default: a temporary folder)")
    parser.add_argument("--stored-exhaustive", action="store_true",
                        help="take each space's optimum from the exhaustive study kept in --results-dir, unchecked")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(args.results_dir or tmp)
        rows = []
        for name in args.spaces.split(","):
            samplers = ("auto",) + tuple(x for x in args.compare.split(",") if x)
            jobs = tuple(int(j) for j in args.exhaustive_jobs.split(","))
            rows.append(measure(name, args.seeds, args.n_trials, results, samplers, jobs, args.stored_exhaustive))
            print(f"# {name} done", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)


if __name__ == "__main__":
    main()
