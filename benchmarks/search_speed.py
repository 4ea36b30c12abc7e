"""Search speed on GPT-3 175B / 1024 A100-80GB (global batch 1536): not a test, a measurement.

Prints (issue 12's targets in brackets; all on the 2-core development machine, whose load is printed too):
  * ms per simulated layout over every valid layout of search_spaces/gpt3-175b-1024xa100.yaml
    (interleaved included): median and p90 of each layout's best of ``--repeats`` warm calls
    [median <= 1 ms, p90 <= 3 ms], and the first pass (traces and pipeline programs built) for reference;
  * a grid, 1F1B and interleaved (v=3), TP8, PP 4-32, 16-1024 micro-batches: median and p90 ms of
    ``--grid-repeats`` warm calls per layout, and the first (cold) call [interleaved PP32, m=1024 <= 10 ms];
  * start-up: importing the CLI, and tracing every shape of the space cold (torch imported) vs from the
    trace cache;
  * simulating every layout in batches through a fresh pool of 1 and 2 worker processes (no storage);
  * ``echo-tune search --sampler exhaustive`` wall time, a fresh process each time (start-up included),
    ``--n-jobs 1`` and ``2`` alternating, ``--exhaustive-repeats`` each: median and the median paired
    ratio [n-jobs 2 <= 10 s, >= 1.8x faster than n-jobs 1];
  * optionally (``--seeds N``) how many TPE trials reach within 1% of the exhaustive optimum.

    python benchmarks/search_speed.py [--repeats 3] [--grid-repeats 7] [--exhaustive-repeats 3] [--seeds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from echo_tune.search import SearchOptions, check_space, load_space, run_search  # noqa: E402

DEFAULT_SPACE = REPO / "search_spaces" / "gpt3-175b-1024xa100.yaml"


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def per_layout_ms(space, valid, repeats: int) -> dict:
    """First-pass and warm (best of ``repeats``) ms per layout over the whole space."""
    from echo_tune.sim.simulate import simulate

    first, warm = [], []
    for c in valid:
        start = time.perf_counter()
        simulate(space.model, space.cluster, c.num_gpus, c.parallel)
        first.append((time.perf_counter() - start) * 1e3)
    for c in valid:
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            simulate(space.model, space.cluster, c.num_gpus, c.parallel)
            best = min(best, (time.perf_counter() - start) * 1e3)
        warm.append(best)
    return {"median_ms": statistics.median(warm), "p90_ms": _p90(warm), "max_ms": max(warm),
            "mean_ms": statistics.fmean(warm), "first_pass_median_ms": statistics.median(first),
            "first_pass_p90_ms": _p90(first), "first_pass_total_s": sum(first) / 1e3}


def grid(space, repeats: int) -> list[dict]:
    """GPT-3 175B, TP8, micro-batch 1: each schedule at PP 4-32 and 16-1024 micro-batches."""
    from echo_tune.config.specs.parallel import ParallelConfig
    from echo_tune.errors import ConfigError
    from echo_tune.sim.simulate import simulate

    rows = []
    for schedule in ("1f1b", "interleaved"):
        for pp in (4, 8, 16, 32):
            for m in (16, 64, 256, 1024):
                dp = 1024 // (8 * pp)
                parallel = ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=pp,
                                          global_batch_size=m * dp, micro_batch_size=1, sequence_parallel=True,
                                          recompute_granularity="full", recompute_method="uniform",
                                          recompute_num_layers=1, use_distributed_optimizer=True,
                                          overlap_grad_reduce=True, overlap_param_gather=True,
                                          virtual_pipeline_model_parallel_size=3 if schedule == "interleaved" else None)
                row = {"schedule": schedule, "pp": pp, "micro_batches": m}
                try:
                    start = time.perf_counter()
                    simulate(space.model, space.cluster, 1024, parallel)
                    row["first_ms"] = (time.perf_counter() - start) * 1e3
                except ConfigError as exc:
                    row["invalid"] = str(exc)
                    rows.append(row)
                    continue
                times = []
                for _ in range(repeats):
                    start = time.perf_counter()
                    simulate(space.model, space.cluster, 1024, parallel)
                    times.append((time.perf_counter() - start) * 1e3)
                row.update(median_ms=statistics.median(times), p90_ms=_p90(times), best_ms=min(times))
                rows.append(row)
    return rows


def _run(code: str, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=REPO)
    return time.perf_counter() - start


def startup(space_file: Path) -> dict:
    """Seconds: import the CLI; trace every shape of the space cold (torch) and from the trace cache."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    trace_all = ("from echo_tune.search import load_space, check_space\n"
                 "from echo_tune.sim.schedule.passes import trace_pieces\n"
                 f"s = load_space({str(space_file)!r}); v, _ = check_space(s)\n"
                 "[trace_pieces(s.model, c.parallel, c.layout) for c in v]\n")
    with tempfile.TemporaryDirectory() as cache:
        cold_env = dict(env, ECHO_TUNE_CACHE_DIR=cache)
        cold = _run(trace_all, cold_env)
        warm = _run(trace_all, cold_env)
    return {"import_cli_s": _run("import echo_tune.cli.main, echo_tune.search", env),
            "enumerate_and_trace_cold_s": cold, "enumerate_and_trace_cached_s": warm}


def exhaustive_walls(space_file: Path, repeats: int) -> dict:
    """CLI wall time (a fresh process: start-up included), n-jobs 1 and 2 alternating."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    walls: dict[int, list[float]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for n in (1, 2):
                out = Path(tmp) / f"{n}-{i}"
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "echo_tune.cli.main", "search", str(space_file), "--sampler",
                                "exhaustive", "--n-jobs", str(n), "--results-dir", str(out)], check=True, env=env,
                               stdout=subprocess.DEVNULL, cwd=REPO)
                walls[n].append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(walls[1], walls[2])]
    return {"n_jobs_1_s": walls[1], "n_jobs_2_s": walls[2], "median_n_jobs_1_s": statistics.median(walls[1]),
            "median_n_jobs_2_s": statistics.median(walls[2]), "median_speedup": statistics.median(ratios)}


def _timed_batch(space, batch, pieces) -> tuple[int, float]:
    """(worker pid, CPU seconds) of one batch, run in a worker."""
    from echo_tune.search.engines.exhaustive import _evaluate_batch

    start = time.process_time()
    _evaluate_batch(space, batch, None, pieces)
    return os.getpid(), time.process_time() - start


def simulation_scaling(space, valid) -> dict:
    """Simulating every layout through 1 and 2 fresh worker processes (storage left out): wall seconds,
    and CPU seconds per worker. On a loaded machine the wall time says how much CPU the others left us;
    the busiest worker's CPU time says what two idle cores would give."""
    from joblib.externals.loky import get_reusable_executor

    from echo_tune.search.engines.exhaustive import _pieces_for, batches

    out = {}
    for n in (1, 2):
        parts = batches(valid, n)
        payload = [(b, _pieces_for(space, b)) for b in parts]
        pool = get_reusable_executor(max_workers=n, kill_workers=True, reuse=False)
        start = time.perf_counter()
        cpu: dict[int, float] = {}
        for f in [pool.submit(_timed_batch, space, b, pieces) for b, pieces in payload]:
            pid, seconds = f.result()
            cpu[pid] = cpu.get(pid, 0.0) + seconds
        out[f"n_jobs_{n}_s"] = time.perf_counter() - start
        out[f"n_jobs_{n}_cpu_s_per_worker"] = sorted(cpu.values(), reverse=True)
        pool.shutdown(wait=True)
    out["speedup"] = out["n_jobs_1_s"] / out["n_jobs_2_s"]
    out["cpu_speedup"] = sum(out["n_jobs_1_cpu_s_per_worker"]) / out["n_jobs_2_cpu_s_per_worker"][0]
    return out


def tpe_trials(space, seeds: int, max_trials: int) -> dict:
    import optuna

    from echo_tune.search.storage.study_storage import open_storage

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        optimum = run_search(space, SearchOptions(sampler="exhaustive", results_dir=tmp, study_name="ex",
                                                  write_files=False)).best["step_time_s"]
        reached = []
        for seed in range(seeds):
            name = f"tpe-{seed}"
            run_search(space, SearchOptions(sampler="tpe", n_trials=max_trials, seed=seed, results_dir=tmp,
                                            study_name=name, write_files=False))
            study = optuna.load_study(study_name=name, storage=open_storage(tmp / name).storage)
            hit = None
            for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
                record = t.user_attrs.get("record")
                if t.state.name == "COMPLETE" and record and record["fits_memory"] and \
                        record["step_time_s"] <= 1.01 * optimum:
                    hit = t.number + 1
                    break
            reached.append(hit)
    return {"tpe_trials_to_1pct": reached,
            "tpe_median": statistics.median([r if r is not None else float("inf") for r in reached])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default=str(DEFAULT_SPACE))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--grid-repeats", type=int, default=7)
    parser.add_argument("--exhaustive-repeats", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=0, help="TPE seeds to check against the optimum (0: skip)")
    parser.add_argument("--max-trials", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    space_file = Path(args.space)
    space = load_space(space_file)
    load_before = os.getloadavg()
    valid, _ = check_space(space)
    result = {"space": str(space_file), "valid_layouts": len(valid), "load_average_before": load_before,
              "per_layout": per_layout_ms(space, valid, args.repeats), "grid": grid(space, args.grid_repeats),
              "startup": startup(space_file), "simulation_only": simulation_scaling(space, valid),
              "exhaustive": exhaustive_walls(space_file, args.exhaustive_repeats)}
    if args.seeds:
        result["tpe"] = tpe_trials(space, args.seeds, args.max_trials)
    result["load_average_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return 0
    per, ex, st = result["per_layout"], result["exhaustive"], result["startup"]
    print(f"space                  {space.name}: {len(valid)} valid layouts; load average "
          f"{load_before[0]:.1f} before, {result['load_average_after'][0]:.1f} after (2 cores)")
    print(f"ms per layout (warm)   median {per['median_ms']:.2f}, p90 {per['p90_ms']:.2f}, max {per['max_ms']:.2f}, "
          f"mean {per['mean_ms']:.2f}   (targets: median <= 1, p90 <= 3)")
    print(f"ms per layout (first)  median {per['first_pass_median_ms']:.2f}, p90 {per['first_pass_p90_ms']:.2f}, "
          f"total {per['first_pass_total_s']:.1f} s (traces and pipeline programs built as they come)")
    print("grid (TP8, mb 1, ms)   schedule     PP  micro-batches  median    p90   best  first")
    for row in result["grid"]:
        if "invalid" in row:
            print(f"                       {row['schedule']:<11} {row['pp']:>3}  {row['micro_batches']:>13}  "
                  f"(not a valid layout)")
            continue
        print(f"                       {row['schedule']:<11} {row['pp']:>3}  {row['micro_batches']:>13}  "
              f"{row['median_ms']:6.2f} {row['p90_ms']:6.2f} {row['best_ms']:6.2f} {row['first_ms']:6.1f}")
    print(f"start-up               import CLI {st['import_cli_s']:.2f} s; enumerate + trace all shapes: cold "
          f"{st['enumerate_and_trace_cold_s']:.2f} s, from the trace cache {st['enumerate_and_trace_cached_s']:.2f} s")
    print(f"exhaustive (CLI wall)  n-jobs 1: {', '.join(f'{s:.1f}' for s in ex['n_jobs_1_s'])} s; n-jobs 2: "
          f"{', '.join(f'{s:.1f}' for s in ex['n_jobs_2_s'])} s; median {ex['median_n_jobs_1_s']:.1f} vs "
          f"{ex['median_n_jobs_2_s']:.1f} s, paired speed-up {ex['median_speedup']:.2f}x "
          f"(targets: <= 10 s, >= 1.8x)")
    sim = result["simulation_only"]
    print(f"simulate all layouts   fresh worker pool, storage left out: 1 process {sim['n_jobs_1_s']:.2f} s, "
          f"2 processes {sim['n_jobs_2_s']:.2f} s wall (speed-up {sim['speedup']:.2f}x); CPU s per worker "
          f"{', '.join(f'{x:.2f}' for x in sim['n_jobs_1_cpu_s_per_worker'])} vs "
          f"{', '.join(f'{x:.2f}' for x in sim['n_jobs_2_cpu_s_per_worker'])} "
          f"(busiest-worker speed-up {sim['cpu_speedup']:.2f}x)")
    if "tpe" in result:
        print(f"TPE trials to 1%       {result['tpe']['tpe_trials_to_1pct']}; median {result['tpe']['tpe_median']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
