"""How far a collective profile fitted on 1-2 servers carries: the held-out A100 table of the README.

    python benchmarks/collectives_heldout.py [--refit]

Fits (with --refit; else reads the shipped profile.yaml) on the 1-16 GPU all_reduce_perf logs of
calibration/azure-ndv4-a100-40gb/nccl-tests/ and prints predicted / measured time and error for
every size from 1 MiB up on the 16-GPU log and on the 32-, 64- and 128-GPU logs of
nccl-tests-heldout/, which no fit reads, with the worst error per log.
"""

from __future__ import annotations

import sys
from pathlib import Path

from echo_tune.calibrate.check import check_log
from echo_tune.calibrate.fit import fit_profile
from echo_tune.config.loading import load_cluster
from echo_tune.cost.profile import load_profile

A100 = Path(__file__).resolve().parents[1] / "calibration" / "azure-ndv4-a100-40gb"
MIB = 1 << 20


def main(refit: bool) -> int:
    cluster = load_cluster(A100 / "cluster.yaml")
    if refit:
        logs = [A100 / "nccl-tests" / f"all_reduce_{n}gpu.log" for n in (1, 2, 4, 8, 16)]
        profile = fit_profile(cluster, nccl_logs=logs).profile
    else:
        profile = load_profile(A100 / "profile.yaml")
    paths = {16: A100 / "nccl-tests" / "all_reduce_16gpu.log"}
    paths.update({n: A100 / "nccl-tests-heldout" / f"all_reduce_{n}gpu.log" for n in (32, 64, 128)})
    results = {n: check_log(cluster, profile, path) for n, path in paths.items()}
    print("| size | " + " | ".join(f"{n} GPUs ({n // 8} nodes)" for n in results) + " |")
    print("| ---: |" + " ---: |" * len(results))
    sizes = sorted({p.size_bytes for r in results.values() for p in r.points if p.size_bytes >= MIB})
    for size in sizes:
        cells = []
        for r in results.values():
            point = next((p for p in r.points if p.size_bytes == size), None)
            cells.append(f"{point.predicted_time_us:.0f} / {point.measured_time_us:.0f} us "
                         f"({point.relative_error:+.1%})" if point else "")
        label = f"{size >> 20} MiB" if size < 1 << 30 else f"{size >> 30} GiB"
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("| worst | " + " | ".join(f"{r.max_abs_error(MIB):.1%}" for r in results.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main("--refit" in sys.argv[1:]))
