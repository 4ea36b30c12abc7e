"""How far a collective profile fitted on 1-2 servers carries: the held-out A100 table of the README.

    python benchmarks/collectives_heldout.py [--refit]

Fits (with --refit; else reads the shipped profile.yaml) on the 1-16 GPU all_reduce_perf logs of
calibration/azure-ndv4-a100-40gb/nccl-tests/ and prints predicted / measured time and error for
every size from 1 MiB up on the 16-GPU log and on the 32-, 64- and 128-GPU logs of
nccl-tests-heldout/, which no fit reads, with the worst and mean error per log; then the profile
fitted on one node only (1-8 GPU logs, --refit; else profile-1node.yaml) the same way, and the time
of one ``collective_time_s`` call (the simulator's hot path).
"""

from __future__ import annotations

import sys
import timeit
from pathlib import Path

from echo_tune.calibrate.fit.check import check_log
from echo_tune.calibrate.fit.fit_profile import fit_profile
from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.config.load.loading import load_cluster
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import load_profile

A100 = Path(__file__).resolve().parents[1] / "calibration" / "azure-ndv4-a100-40gb"
MIB = 1 << 20


def table(cluster, profile) -> None:
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
    means = [[abs(p.relative_error) for p in r.points if p.size_bytes >= MIB] for r in results.values()]
    print("| mean | " + " | ".join(f"{sum(m) / len(m):.1%}" for m in means) + " |")


def main(refit: bool) -> int:
    cluster = load_cluster(A100 / "cluster.yaml")
    logs = [A100 / "nccl-tests" / f"all_reduce_{n}gpu.log" for n in (1, 2, 4, 8, 16)]
    profiles = {"fitted on 1-16 GPUs (profile.yaml)": (fit_profile(cluster, nccl_logs=logs).profile if refit
                                                       else load_profile(A100 / "profile.yaml")),
                "fitted on one node, 1-8 GPUs (profile-1node.yaml)": (
                    fit_profile(cluster, nccl_logs=logs[:4]).profile if refit
                    else load_profile(A100 / "profile-1node.yaml"))}
    for label, profile in profiles.items():
        print(f"\n{label}\n")
        table(cluster, profile)
    profile = profiles["fitted on 1-16 GPUs (profile.yaml)"]
    place = GroupPlacement(size=128, ranks_per_node=8, num_nodes=16)
    calls = 20000
    best = min(timeit.repeat(lambda: collective_time_s("all_reduce", 32 * MIB, place, profile), number=calls, repeat=5))
    print(f"\ncollective_time_s: {best / calls * 1e6:.2f} us per call (all_reduce, 32 MiB, 128 GPUs on 16 nodes; "
          f"best of 5 x {calls})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main("--refit" in sys.argv[1:]))
