"""Search speed on GPT-3 175B / 1024 A100-80GB (global batch 1536): not a test, a measurement.

Prints:
  * the size of the valid layout space (search_spaces/gpt3-175b-1024xa100.yaml),
  * the median milliseconds per simulated layout (one process, every valid layout once; the first
    layout of each traced shape pays its trace and is an outlier the median ignores),
  * the wall time of ``--sampler exhaustive`` (storage and output files included),
  * how many TPE trials it takes to come within 1% of the exhaustive optimum, per seed and the median.

Targets (issue #3): < 5 ms per layout, exhaustive < 60 s on the 2-core dev machine, TPE within 1% in at
most 200 trials (median over 5 seeds).

    python benchmarks/search_speed.py [--space FILE] [--n-jobs 2] [--seeds 5] [--max-trials 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import optuna

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from echo_tune.search import SearchOptions, check_space, load_space, run_search  # noqa: E402
from echo_tune.search.storage import open_storage  # noqa: E402

DEFAULT_SPACE = REPO / "search_spaces" / "gpt3-175b-1024xa100.yaml"


def ms_per_layout(space, valid) -> tuple[float, float]:
    """(median, mean) milliseconds of one simulate call over every valid layout, one process."""
    from echo_tune.sim.simulate import simulate

    simulate(space.model, space.cluster, valid[0].num_gpus, valid[0].parallel)  # import and warm up torch
    times = []
    for c in valid:
        start = time.perf_counter()
        simulate(space.model, space.cluster, c.num_gpus, c.parallel)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, statistics.fmean(times) * 1e3


def trials_to_reach(results_dir: Path, name: str, target_s: float) -> int | None:
    """1-based number of the first trial whose feasible step time is within ``target_s`` (None: never)."""
    study = optuna.load_study(study_name=name, storage=open_storage(results_dir / name).storage)
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        record = t.user_attrs.get("record")
        if t.state.name == "COMPLETE" and record and record["fits_memory"] and record["step_time_s"] <= target_s:
            return t.number + 1
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default=str(DEFAULT_SPACE))
    parser.add_argument("--n-jobs", type=int, default=2)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--max-trials", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    space = load_space(args.space)

    start = time.perf_counter()
    valid, _ = check_space(space)
    enumerate_s = time.perf_counter() - start
    median_ms, mean_ms = ms_per_layout(space, valid)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        exhaustive = run_search(space, SearchOptions(sampler="exhaustive", n_jobs=args.n_jobs, results_dir=tmp,
                                                     study_name="exhaustive"))
        exhaustive_s = time.perf_counter() - start
        optimum = exhaustive.best["step_time_s"]
        reached, tpe_s = [], []
        for seed in range(args.seeds):
            name = f"tpe-{seed}"
            start = time.perf_counter()
            run_search(space, SearchOptions(sampler="tpe", n_trials=args.max_trials, seed=seed, results_dir=tmp,
                                            study_name=name, write_files=False))
            tpe_s.append(time.perf_counter() - start)
            reached.append(trials_to_reach(tmp, name, 1.01 * optimum))
    median_trials = statistics.median([r if r is not None else float("inf") for r in reached])

    result = {
        "space": str(args.space), "valid_layouts": len(valid), "enumerate_s": enumerate_s,
        "median_ms_per_layout": median_ms, "mean_ms_per_layout": mean_ms,
        "exhaustive_wall_s": exhaustive_s, "exhaustive_n_jobs": args.n_jobs, "optimum_step_time_s": optimum,
        "optimum_config": exhaustive.best["config"], "tpe_trials_to_1pct": reached,
        "tpe_median_trials_to_1pct": median_trials, "tpe_wall_s": tpe_s, "max_trials": args.max_trials,
    }
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    print(f"space                        {space.name}: {space.model.name} on {valid[0].num_gpus} x "
          f"{space.cluster.name}, global batch {space.global_batch_size}")
    print(f"valid layouts                {len(valid)} (enumerated in {enumerate_s:.2f} s)")
    print(f"simulate, ms per layout      median {median_ms:.2f}, mean {mean_ms:.2f}   (target < 5 ms)")
    print(f"exhaustive search            {exhaustive_s:.1f} s wall with --n-jobs {args.n_jobs}   (target < 60 s)")
    print(f"exhaustive optimum           {optimum:.3f} s per step")
    shown = ", ".join(str(r) if r is not None else f">{args.max_trials}" for r in reached)
    print(f"TPE trials to within 1%      {shown}; median {median_trials}   (target <= 200)")
    print(f"TPE wall per {args.max_trials}-trial study  {', '.join(f'{s:.1f}' for s in tpe_s)} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
