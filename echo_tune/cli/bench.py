"""``echo-tune bench``: run the calibration microbenchmarks.

Under torchrun (RANK set) every process runs its share; with ``--nproc-per-node N`` this command
launches torchrun itself on this node (``--standalone``); otherwise it runs as one process
(compute benchmarks only: a group of one has no collectives to time).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from echo_tune.calibrate.bench.bench_args import add_bench_arguments
from echo_tune.calibrate.bench.raw import check_bench_name
from echo_tune.cli.common import print_json
from echo_tune.errors import CalibrationError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="run calibration microbenchmarks (GEMM, attention, memory, collectives, interference)",
        description="Short microbenchmarks whose raw results `echo-tune calibrate fit --bench` turns into a "
                    "profile. Launch with torchrun on each node, e.g. `torchrun --standalone "
                    "--nproc-per-node 8 --no-python echo-tune bench --name my-cluster`, or pass "
                    "--nproc-per-node to have this command start torchrun on this node.")
    add_bench_arguments(parser)
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="launch torchrun --standalone with this many processes on this node")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (the output folder and the files written) instead of a line")
    parser.set_defaults(run=run)


def _report(args: argparse.Namespace, out) -> None:
    out = Path(out)
    if args.json:
        files = sorted(str(p) for p in out.rglob("*") if p.is_file()) if out.is_dir() else []
        print_json({"output_dir": str(out), "files": files})
    else:
        print(f"echo-tune bench: wrote {out}")


def _torchrun_command(args: argparse.Namespace, argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(args.nproc_per_node), "-m", "echo_tune.calibrate.bench.microbench", *argv]


def _forwarded_argv(args: argparse.Namespace) -> list[str]:
    argv = ["--name", args.name, "--output-root", args.output_root, "--device", args.device]
    if args.quick:
        argv.append("--quick")
    if args.dtypes:
        argv += ["--dtypes", args.dtypes]
    if args.skip:
        argv += ["--skip", args.skip]
    if args.ranks_per_node:
        argv += ["--ranks-per-node", str(args.ranks_per_node)]
    return argv


def _check_args(args: argparse.Namespace) -> None:
    """What torchrun's children would fail on, refused here in one line (issue 20) before anything starts."""
    check_bench_name(args.name)
    if args.nproc_per_node is not None and "RANK" not in os.environ:
        if args.nproc_per_node < 1:
            raise CalibrationError(f"`--nproc-per-node >= 1` must hold, but got (nproc_per_node={args.nproc_per_node})")
        if args.ranks_per_node and args.nproc_per_node % args.ranks_per_node:
            raise CalibrationError(f"`--nproc-per-node % --ranks-per-node == 0` must hold (every simulated node holds "
                                   f"the same number of ranks), but got (nproc_per_node={args.nproc_per_node}, "
                                   f"ranks_per_node={args.ranks_per_node}); give a divisor of --nproc-per-node")
    world = os.environ.get("WORLD_SIZE")
    if args.ranks_per_node and world is not None and world.isdigit() and int(world) % args.ranks_per_node:
        raise CalibrationError(f"`world_size % --ranks-per-node == 0` must hold, but got (world_size={world}, "
                               f"ranks_per_node={args.ranks_per_node}); give a divisor of the process count")


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    if args.nproc_per_node is not None and "RANK" not in os.environ:
        code = subprocess.call(_torchrun_command(args, _forwarded_argv(args)),
                               stdout=subprocess.DEVNULL if args.json else None)
        if code == 0 and args.json:
            _report(args, Path(args.output_root) / args.name)
        return code
    from echo_tune.calibrate.bench.microbench import run_bench  # imports torch

    out = run_bench(args)
    if int(os.environ.get("RANK", "0")) == 0:
        _report(args, out)
    return 0
