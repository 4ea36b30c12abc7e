"""One process against two, end to end through the installed command: not a test, a measurement.

Runs ``echo-tune search ... --sampler exhaustive --n-jobs N`` as a user would (a fresh process each time: the
interpreter's start, the imports, the search, the output files, the exit), alternating one process and two
so that a machine whose speed drifts weighs on both alike, and prints every run, each pair's ratio and the
medians. The default space is issue 22's: Qwen3-30B-A3B on 256 H100, global batch 1024, sequence 4096.

    python benchmarks/cli_parallel.py [--pairs 5] [--jobs 2] [--json] [-- <search arguments>]

Needs the package installed (``pip install -e .``): it runs the ``echo-tune`` next to this interpreter.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_SPACE = ["--model", "qwen3-30b-a3b", "--cluster", "h100", "--num-gpus", "256", "--global-batch-size", "1024",
                 "--seq-length", "4096"]


def command() -> list[str]:
    script = Path(sys.executable).with_name("echo-tune")
    if not script.exists():
        raise SystemExit(f"{script} not found: install the package first (pip install -e .)")
    return [str(script)]


def one_run(space_args: list[str], n_jobs: int) -> float:
    with tempfile.TemporaryDirectory() as results:
        started = time.perf_counter()
        done = subprocess.run(command() + ["search", *space_args, "--sampler", "exhaustive", "--n-jobs", str(n_jobs),
                                           "--results-dir", results, "--json"], capture_output=True, text=True)
        wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"echo-tune search --n-jobs {n_jobs} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return wall_s


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, space_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2, help="the process count compared with one")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(own)
    space_args = space_args or DEFAULT_SPACE
    one_run(space_args, 1)  # warms the trace cache and the page cache; not counted
    pairs = []
    for _ in range(args.pairs):
        one, several = one_run(space_args, 1), one_run(space_args, args.jobs)
        pairs.append((one, several))
        if not args.json:
            print(f"1 process {one:6.2f} s   {args.jobs} processes {several:6.2f} s   ratio {one / several:.2f}x",
                  flush=True)
    median_one = statistics.median(p[0] for p in pairs)
    median_several = statistics.median(p[1] for p in pairs)
    summary = {"space": space_args, "jobs": args.jobs, "runs_s": pairs, "median_one_s": median_one,
               "median_several_s": median_several, "ratio_of_medians": median_one / median_several,
               "median_pair_ratio": statistics.median(p[0] / p[1] for p in pairs)}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"medians: 1 process {median_one:.2f} s, {args.jobs} processes {median_several:.2f} s: "
              f"{summary['ratio_of_medians']:.2f}x (median of the pairs' ratios {summary['median_pair_ratio']:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
