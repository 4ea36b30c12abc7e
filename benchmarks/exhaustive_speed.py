"""Exhaustive search speed (issue 38: 10^5 layouts in <= 60 s with two processes): not a test, a measurement.

For each space (``search_quality.py``'s names): the exhaustive search as ``search_quality.py --exhaustive-jobs``
runs it (``run_search``, a fresh study, no output files), its wall time, the CPU time of this process and of
the worker processes (ended and reaped after the run), and the load average before and after (the machine is
shared: the CPU time is what compares between runs). ``--sample N`` measures instead the CPU time per layout
of the workers' part alone: every N-th batch of ``exhaustive.batches`` (as two processes cut them) simulated
and frozen in this process, nothing stored.

    python benchmarks/exhaustive_speed.py [--spaces qwen3-235b-a22b-256-recipes] [--jobs 2] [--sample N] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from search_quality import build, measure  # noqa: E402


def run(name: str, jobs: int) -> dict:
    """The exhaustive search of ``name`` with ``jobs`` processes: wall and CPU seconds."""
    from echo_tune.search.engines.workers import stop_workers

    load = os.getloadavg()[0]
    cpu = time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        row = measure(name, 0, None, Path(tmp), jobs=(jobs,))
    cpu = time.process_time() - cpu
    stop_workers()  # the workers' CPU time counts once they are reaped
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    exhaustive = row["exhaustive"][0]
    return {"space": name, "jobs": jobs, "layouts": row["layouts"], "simulated": exhaustive["simulated"],
            "optimum_s": row["optimum_s"], "wall_s": exhaustive["wall_s"], "parent_cpu_s": cpu,
            "workers_cpu_s": children.ru_utime + children.ru_stime, "load_before": load,
            "load_after": os.getloadavg()[0]}


def sample(name: str, every: int) -> dict:
    """CPU ms per layout of simulating and freezing every ``every``-th batch here (the workers' part)."""
    from echo_tune.search.engines.exhaustive import _evaluate_batch, _pieces_for, batches
    from echo_tune.search.space.dominance import Dominance
    from echo_tune.search.space.space_check import check_space

    space = build(name)
    parts = batches(check_space(space)[0], 2)[::every]
    pieces = [_pieces_for(space, b) for b in parts]  # traced (or read from the trace cache) outside the timing
    gc.disable()  # as in a worker during a task (gc_pause.task_begins)
    cpu = time.process_time()
    done = [_evaluate_batch(space, b, None, p, Dominance(space, None)) for b, p in zip(parts, pieces)]
    cpu = time.process_time() - cpu
    gc.enable()
    layouts = sum(map(len, done))
    simulated = sum(1 for trials in done for t in trials if "record" in t.user_attrs)
    return {"space": name, "every": every, "layouts": layouts, "simulated": simulated, "cpu_s": cpu,
            "ms_per_layout": 1e3 * cpu / layouts, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spaces", default="qwen3-235b-a22b-256-recipes")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--sample", type=int, default=0, help="every N-th batch simulated here, nothing stored")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [sample(name, args.sample) if args.sample else run(name, args.jobs) for name in args.spaces.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        if args.sample:
            print(f"{r['space']}: every {r['every']}th batch, {r['layouts']} layouts ({r['simulated']} simulated): "
                  f"{r['cpu_s']:.2f} s CPU, {r['ms_per_layout']:.3f} ms per layout (load {r['load']:.1f})")
        else:
            print(f"{r['space']}: {r['layouts']} layouts ({r['simulated']} simulated), optimum {r['optimum_s']:.4f} s; "
                  f"exhaustive with {r['jobs']} processes {r['wall_s']:.1f} s wall; CPU {r['parent_cpu_s']:.1f} s "
                  f"here + {r['workers_cpu_s']:.1f} s workers; load {r['load_before']:.1f} -> {r['load_after']:.1f}")


if __name__ == "__main__":
    main()
