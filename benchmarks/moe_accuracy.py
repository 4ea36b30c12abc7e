"""Accuracy on the MoE rows of runs_modern.csv (Grok-1 314B and proxies, H100, dgxc-benchmarking
v24.11.1): measured vs simulated step time, as the CSV reads (no dispatcher column: Megatron's default
allgather; ``--no-errata``) and with the settings the rows' source file states (the errata:
alltoall dispatcher, capacity 1.0 padded, no dropout, no biases, bf16 gradient reduction). Datasheet
profile, nothing fitted.

    python benchmarks/moe_accuracy.py [path/to/runs_modern.csv]
"""

from __future__ import annotations

import sys
from pathlib import Path

from echo_tune.sim.simulate import simulate
from echo_tune.validate import read_runs
from echo_tune.validate.datasets import published_runs

DEFAULT = published_runs("runs_modern.csv")


def main(path: Path) -> None:
    plain = {c.name: c for c in read_runs(path, errata=False)}
    cases = [c for c in read_runs(path) if c.error is None and c.model.is_moe]
    print(f"{'run':38s} {'measured s':>10s} {'as CSV s':>9s} {'err':>7s} {'errata s':>10s} {'err':>7s} fits")
    errors = {"csv": [], "errata": []}
    for c in cases:
        row = [f"{c.name:38s}", f"{c.measured_step_time_s:10.2f}"]
        fits = True
        for key, case in (("csv", plain[c.name]), ("errata", c)):
            report = simulate(case.model, case.cluster, case.num_gpus, case.parallel)
            err = 100 * (report.step_time_s / c.measured_step_time_s - 1)
            errors[key].append(abs(err))
            fits = fits and report.fits_memory
            row += [f"{report.step_time_s:9.2f}" if key == "csv" else f"{report.step_time_s:10.2f}", f"{err:+6.1f}%"]
        print(" ".join(row), "yes" if fits else "NO")
    for key, errs in errors.items():
        if errs:
            print(f"{key:9s}: MAE {sum(errs) / len(errs):.1f}%, worst {max(errs):.1f}% over {len(errs)} rows")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
