"""docs/accuracy.md and the README's accuracy table, generated from the current code (``benchmarks/accuracy_table.py``).

Every shipped published-run set is simulated with the default profiles; each row's error is signed (predicted -
measured, % of measured; negative = predicted too fast). *In sample* is that error; *out of sample* replaces it, for
the rows the shipped host time per kernel was fitted on, with the error of a fit that never saw the row's source
(leave-one-source-out, stored per row in the fit file: ``cost/host/host_time.py``); every other row was fitted on
nothing. The page holds numbers only (no dates, no code digest), so it changes exactly when a prediction does, and a
test compares the committed page with a fresh one (tests/validate/test_accuracy_page.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from echo_tune.validate.held_out import out_of_sample_errors
from echo_tune.validate.compare import simulate_case, simulate_gpu_side
from echo_tune.validate.datasets import DATASETS, published_runs
from echo_tune.validate.runs import read_runs

README_START, README_END = "<!-- accuracy-table:start -->", "<!-- accuracy-table:end -->"


@dataclass(frozen=True, kw_only=True)
class Row:
    dataset: str
    name: str
    family: str
    in_sample_pct: float
    out_of_sample_pct: float
    fits_memory: bool
    gpu_side_pct: float | None = None
    """The error with the host time per kernel at 0 (the GPU side alone)."""

    @property
    def fitted(self) -> bool:
        return self.in_sample_pct != self.out_of_sample_pct


def family_of(case) -> str:
    kind = "MoE" if case.model is not None and (case.model.num_experts or 0) > 1 else "dense"
    return f"{case.cluster.gpu.name} {kind}"


def collect_rows() -> tuple[list[Row], list[tuple[str, str, str]]]:
    """Every shipped row that simulates, and (dataset, name, reason) of those that do not."""
    rows, refused = [], []
    for dataset in DATASETS:
        for case in read_runs(published_runs(dataset)):
            result = simulate_case(case)
            if result.error_pct is None or case.cluster is None:
                refused.append((dataset, case.name, (result.error or case.error or "").split("\n")[0]))
                continue
            (held_out,) = out_of_sample_errors([(case, result)])
            rows.append(Row(dataset=dataset, name=case.name, family=family_of(case), in_sample_pct=result.error_pct,
                            out_of_sample_pct=held_out, fits_memory=bool(result.fits_memory),
                            gpu_side_pct=simulate_gpu_side(case).error_pct))
    return rows, refused


def _stats(errors: list[float]) -> str:
    worst = max(errors, key=abs)
    return f"{statistics.median(errors):+.1f}% | {statistics.fmean(map(abs, errors)):.1f}% | {worst:+.1f}%"


def family_table(rows: list[Row], key) -> list[str]:
    """One line per group: runs, then median signed error, MAPE and worst, in sample and out of sample, and the
    median error with the host time per kernel at 0."""
    lines = ["| group | runs | median | MAPE | worst | out-of-sample median | MAPE | worst | host time 0 median | "
             "out of memory |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    for name in sorted(groups) + ["all"]:
        members = rows if name == "all" else groups[name]
        gpu_side = [r.gpu_side_pct for r in members if r.gpu_side_pct is not None]
        lines.append(f"| {name} | {len(members)} | {_stats([r.in_sample_pct for r in members])} | "
                     f"{_stats([r.out_of_sample_pct for r in members])} | "
                     f"{f'{statistics.median(gpu_side):+.1f}%' if gpu_side else '-'} | "
                     f"{sum(not r.fits_memory for r in members)} |")
    return lines


def readme_table(rows: list[Row]) -> list[str]:
    """The README's table: per GPU and dense / MoE, out of sample."""
    lines = ["| family | runs | median signed error | MAPE | worst | out of memory |", "| --- | --- | --- | --- | --- | --- |"]
    groups: dict[str, list[Row]] = {}
    for row in rows:
        groups.setdefault(row.family, []).append(row)
    for name in sorted(groups) + ["all"]:
        members = rows if name == "all" else groups[name]
        errors = [r.out_of_sample_pct for r in members]
        worst = max(members, key=lambda r: abs(r.out_of_sample_pct))
        where = "" if name == "all" else f" ({worst.name})"
        lines.append(f"| {name} | {len(members)} | {statistics.median(errors):+.1f}% | "
                     f"{statistics.fmean(map(abs, errors)):.1f}% | {worst.out_of_sample_pct:+.1f}%{where} | "
                     f"{sum(not r.fits_memory for r in members)} |")
    return lines


def page(rows: list[Row], refused: list[tuple[str, str, str]]) -> str:
    """docs/accuracy.md."""
    fitted = sum(r.fitted for r in rows)
    out = ["# Accuracy: simulated against measured step times", "",
           "Generated by `python benchmarks/accuracy_table.py --write` from the current code; do not edit (a test "
           "compares it with a fresh run). Signed error = (predicted - measured) / measured; negative = predicted too "
           "fast. Default profiles (datasheet peaks, GEMM efficiencies from public kernel benchmarks, the host time "
           "per kernel issued from Python fitted on the rows of x86 hosts, H100 and B200). *Out of sample*: the "
           f"{fitted} rows that host time was fitted on count with their leave-one-source-out error; the other "
           f"{len(rows) - fitted} rows were fitted on nothing, so both columns agree for them. *Host time 0*: the same "
           "row with that fitted host time at 0, its GPU side alone; where it differs from the error, the fit carries "
           "the difference (the error bands use it: plan/host_share.py).", "",
           "## By GPU and dense / MoE", "", *family_table(rows, lambda r: r.family), "",
           "## By data set", "", *family_table(rows, lambda r: r.dataset), "",
           "## Every row", "", "| data set | run | family | error | out of sample | host time 0 | fits |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    out += [f"| {r.dataset} | {r.name} | {r.family} | {r.in_sample_pct:+.1f}% | {r.out_of_sample_pct:+.1f}% | "
            f"{'-' if r.gpu_side_pct is None else f'{r.gpu_side_pct:+.1f}%'} | {'yes' if r.fits_memory else 'no'} |"
            for r in rows]
    if refused:
        out += ["", "## Rows that do not simulate", ""] + [f"- {d} {n}: {why}" for d, n, why in refused]
    out += ["", "## How we got here", "",
            "The data sets and where each row's settings come from: calibration/published-runs/ (SOURCE_README.md), "
            "calibration/collected-runs/ (README.md) and the errata beside echo_tune/validate/. How the model reached these numbers, change by change, is the "
            "project's git history and the session notes; docs/clocks_and_run_calibration.md keeps the reasoning "
            "behind the clocks and the fitted host time, docs/moe.md the MoE mechanisms.", ""]
    return "\n".join(out)


def readme_with_table(text: str, rows: list[Row]) -> str:
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    return text[:start] + "\n" + "\n".join(readme_table(rows)) + "\n" + text[end:]


def write(repo: Path) -> None:
    rows, refused = collect_rows()
    (repo / "docs" / "accuracy.md").write_text(page(rows, refused))
    readme = repo / "README.md"
    readme.write_text(readme_with_table(readme.read_text(), rows))
