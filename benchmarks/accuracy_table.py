"""The README's accuracy table: every shipped published run, by GPU family and dense / MoE.

    python benchmarks/accuracy_table.py [--markdown]

Simulates every row of calibration/published-runs/runs_{megatron,modern,bridge}.csv (errata applied, the
profiles the rows name) and prints per family: runs, median signed error (predicted - measured, % of measured;
negative = predicted too fast), MAPE, worst row, and rows predicted out of memory.
"""

from __future__ import annotations

import argparse
import statistics

from echo_tune.validate import read_runs, simulate_case
from echo_tune.validate.datasets import DATASETS, published_runs


def family(case) -> str:
    kind = "MoE" if case.model is not None and (case.model.num_experts or 0) > 1 else "dense"
    gpu = case.cluster.gpu.name if case.cluster is not None else "?"
    return f"{gpu} {kind}"


def collect() -> dict[str, list[tuple[str, float, bool]]]:
    table: dict[str, list[tuple[str, float, bool]]] = {}
    for name in DATASETS:
        for case in read_runs(published_runs(name)):
            row = simulate_case(case)
            if row.error_pct is None:
                continue
            table.setdefault(family(case), []).append((row.name, row.error_pct, bool(row.fits_memory)))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args()
    table = collect()
    print("| family | runs | median signed error | MAPE | worst | out of memory |")
    print("| --- | --- | --- | --- | --- | --- |")
    everything = []
    for key in sorted(table):
        rows = table[key]
        errs = [e for _, e, _ in rows]
        everything += rows
        worst = max(rows, key=lambda r: abs(r[1]))
        print(f"| {key} | {len(rows)} | {statistics.median(errs):+.1f}% | {statistics.fmean(map(abs, errs)):.1f}% "
              f"| {worst[1]:+.1f}% ({worst[0]}) | {sum(not fits for *_, fits in rows)} |")
    errs = [e for _, e, _ in everything]
    print(f"| all | {len(errs)} | {statistics.median(errs):+.1f}% | {statistics.fmean(map(abs, errs)):.1f}% | "
          f"{max(errs, key=abs):+.1f}% | {sum(not f for *_, f in everything)} |")


if __name__ == "__main__":
    main()
