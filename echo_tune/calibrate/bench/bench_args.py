"""The command-line options of the microbenchmarks, kept free of torch so ``echo-tune --help`` stays fast."""

from __future__ import annotations

import argparse

PARTS = ("gemm", "attention", "memory", "collectives", "interference")


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``echo-tune bench`` and ``python -m echo_tune.calibrate.bench.microbench``."""
    parser.add_argument("--name", default="local", help="cluster name: results go to <output-root>/<name>/raw/")
    parser.add_argument("--output-root", default="calibration", help="root folder of calibration data")
    parser.add_argument("--quick", action="store_true", help="a smaller sweep (under 1 minute per node)")
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto",
                        help="auto: CUDA with nccl when available, else CPU with gloo")
    parser.add_argument("--dtypes", default=None,
                        help="comma-separated GEMM dtypes (default: bf16,fp16 on CUDA; fp32 on CPU)")
    parser.add_argument("--skip", default="", help=f"comma-separated parts to skip, of {','.join(PARTS)}")
    parser.add_argument("--ranks-per-node", type=int, default=None,
                        help="for testing: treat every K consecutive ranks as one node (default: by hostname)")
