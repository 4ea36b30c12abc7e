"""Print simulated vs measured step time and memory for the dense rows of a runs CSV (runs_modern.csv).

    python benchmarks/dense_modern_rows.py [RUNS.csv]

Dense rows only (rows with ``num_experts`` set belong to the MoE model). Each row: measured and
simulated step time, signed error, whether it fits (hard HBM limit, no headroom) and the peak memory;
then the mean absolute error, the worst row and the number predicted out of memory.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from echo_tune.sim.simulate import simulate
from echo_tune.validate.runs import read_runs
from echo_tune.validate.datasets import published_runs

DEFAULT = published_runs("runs_modern.csv")


def main(path: Path) -> None:
    with path.open(newline="") as handle:
        moe = {row["name"] for row in csv.DictReader(handle) if (row.get("num_experts") or "").strip()}
    errors, oom = [], 0
    for case in read_runs(path):
        if case.name in moe:
            continue
        if case.error:
            print(f"{case.name:42s} invalid: {case.error}")
            continue
        report = simulate(case.model, case.cluster, case.num_gpus, case.parallel)
        error = 100 * (report.step_time_s / case.measured_step_time_s - 1)
        errors.append(abs(error))
        oom += not report.fits_memory
        print(f"{case.name:42s} measured {case.measured_step_time_s:7.2f} s  simulated {report.step_time_s:7.2f} s "
              f"{error:+6.1f}%  {'fits' if report.fits_memory else 'OOM '} {report.peak_memory_bytes / 2**30:6.1f} GiB")
    if errors:
        print(f"{len(errors)} dense rows: mean abs error {sum(errors) / len(errors):.1f}%, worst {max(errors):.1f}%, "
              f"{oom} predicted out of memory")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
