"""The accuracy bars of issues 8 and 9, measured: every row of runs_modern.csv and runs_megatron.csv,
with the datasets' errata (source-stated settings, echo_tune/validate/errata/) and without them.

    python benchmarks/validation_bars.py [--before-modern FILE.json] [--before-megatron FILE.json]

``--before-*``: ``echo-tune validate ... --json`` output of another checkout, shown as a first column.
Bars: dense rows of runs_modern (BF16 + FP8) MAPE <= 10%, none worse than 20%, none out of memory;
BF16 MoE rows MAE <= 12%, none worse than 25%, none refused or out of memory; runs_megatron MAPE <= 10%,
worst <= 25%. Datasheet profiles, nothing fitted to these rows.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from echo_tune.validate import validate
from echo_tune.validate.datasets import PUBLISHED_RUNS_DIR

DATA = PUBLISHED_RUNS_DIR


def groups(name: str) -> str:
    if "grok1" in name:
        return "moe-fp8" if "-fp8-" in name else "moe-bf16"
    return "dense"


def stats(errors: list[float | None], fits: list[bool | None]) -> str:
    scored = [abs(e) for e in errors if e is not None]
    if not scored:
        return "no rows scored"
    oom = sum(1 for f in fits if f is False)
    refused = sum(1 for e in errors if e is None)
    return (f"MAPE {sum(scored) / len(scored):.1f}%, worst {max(scored):.1f}%, {len(scored)} rows, "
            f"{oom} out of memory, {refused} refused/invalid")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before-modern")
    parser.add_argument("--before-megatron")
    args = parser.parse_args()
    for csv, before_path in (("runs_modern.csv", args.before_modern), ("runs_megatron.csv", args.before_megatron)):
        before = {}
        if before_path:
            before = {r["name"]: r for r in json.loads(Path(before_path).read_text())["rows"]}
        plain, _, _ = validate(DATA / csv, errata=False)
        fixed, _, _ = validate(DATA / csv, errata=True)
        print(f"\n{csv}: signed error % (fits memory: '' yes, '!' no)")
        head = f"{'row':44s} {'measured s':>10s}" + (f" {'before':>9s}" if before else "") + \
            f" {'no errata':>10s} {'errata':>9s}"
        print(head)
        for a, b in zip(plain, fixed):
            cell = lambda r: "refused" if r.get("error") else f"{r['error_pct']:+.1f}{'' if r['fits_memory'] else '!'}"
            old = f" {cell(before[a.name]) if a.name in before else '-':>9s}" if before else ""
            fmt = lambda r: "refused" if r.error else f"{r.error_pct:+.1f}{'' if r.fits_memory else '!'}"
            print(f"{a.name:44s} {a.measured_step_time_s:10.3f}{old} {fmt(a):>10s} {fmt(b):>9s}")
        for label, kind in (("dense", "dense"), ("BF16 MoE", "moe-bf16"), ("FP8 MoE", "moe-fp8")) \
                if csv == "runs_modern.csv" else (("all", None),):
            pick = lambda rows: [r for r in rows if kind is None or groups(r.name) == kind]
            for tag, rows in (("no errata", plain), ("errata", fixed)):
                chosen = pick(rows)
                print(f"  {label:8s} {tag:9s}: {stats([r.error_pct for r in chosen], [r.fits_memory for r in chosen])}")
            if before:
                chosen = [before[r.name] for r in pick(plain) if r.name in before]
                print(f"  {label:8s} {'before':9s}: {stats([r['error_pct'] for r in chosen], [r['fits_memory'] for r in chosen])}")


if __name__ == "__main__":
    main()
