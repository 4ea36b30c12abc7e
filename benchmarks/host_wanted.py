"""The host time per kernel each published MoE run asks for: where one fitted value stops standing for the host.

The default profiles carry one host time per kernel issued from Python, fitted on every x86-host row
(``cost/host/host_time.py``). If it were a property of the host alone, every row of one kind of host would meet its
measurement near the same value. This prints, for every MoE row that simulates, the value at which that row alone
would be met (bisection on ``host_time_per_kernel_s`` between 1 and 400 us, everything else as shipped), the row's
error at the shipped value, and how much the row moves when the value moves (error at 85 us minus error at 65 us):
a row that barely moves does not measure the host at all, whatever value it "asks" for. Then the median value asked
by host (DGX H100's Xeon 8480C, DGX B200's Xeon 8570, Grace) and model, over the rows that move. Not a test, a
measurement; docs/moe.md ("The host time each row asks for") reads it.

    python benchmarks/host_wanted.py [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from echo_tune.calibrate.fit.fit_runs import with_params  # noqa: E402
from echo_tune.sim.schedule.memo import profile_for_cluster  # noqa: E402
from echo_tune.sim.simulate import simulate  # noqa: E402
from echo_tune.validate.datasets import DATASETS, published_runs  # noqa: E402
from echo_tune.validate.runs import read_runs  # noqa: E402

HOSTS = {"h100-sxm": "DGX H100 (Xeon 8480C)", "b200": "DGX B200 (Xeon 8570)", "gb200": "Grace", "gb300": "Grace"}
"""The host CPU of each GPU preset's published runs (DGX H100 / DGX B200 datasheets; GB200 / GB300 NVL72: Grace)."""
RANGE_S = (1e-6, 400e-6)
MOVES_PCT = 1.0
"""A row whose error changes by less than this between 65 and 85 us per kernel does not measure the host."""


def error_at(case, host_s: float) -> float:
    """The row's signed error (predicted / measured - 1) with the host time per kernel at ``host_s``."""
    profile = with_params(profile_for_cluster(case.cluster), {"host_time_per_kernel_s": host_s})
    step = simulate(case.model, case.cluster, case.num_gpus, case.parallel, profile=profile).step_time_s
    return step / case.measured_step_time_s - 1.0


def wanted_s(case, steps: int = 24) -> float | None:
    """The host time per kernel at which the row is met; None where no value in ``RANGE_S`` meets it."""
    low, high = RANGE_S
    if error_at(case, low) > 0.0 or error_at(case, high) < 0.0:
        return None
    for _ in range(steps):
        mid = (low * high) ** 0.5
        low, high = (low, mid) if error_at(case, mid) > 0.0 else (mid, high)
    return (low * high) ** 0.5


def family(case) -> str:
    """The model a row trains, by its name (mb2509-qwen3-30b-a3b-... -> qwen3-30b-a3b)."""
    for name in ("qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b", "grok1"):
        if name in case.name:
            return name
    return "other"


def measure() -> list[dict]:
    from echo_tune.cost.host.host_time import default_host_time_s

    shipped = default_host_time_s()
    rows = []
    for dataset in DATASETS:
        for case in read_runs(published_runs(dataset)):
            if case.error is not None or case.cluster is None or not case.model.num_experts:
                continue
            want = wanted_s(case)
            moves = 100 * (error_at(case, 85e-6) - error_at(case, 65e-6))
            rows.append({"name": case.name, "gpu": case.cluster.gpu.name, "host": HOSTS.get(case.cluster.gpu.name, "?"),
                         "model": family(case), "wanted_us": None if want is None else want * 1e6,
                         "error_pct": 100 * error_at(case, shipped), "moves_pct": moves})
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Median value asked per (host, model), over the rows that move with it."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r["wanted_us"] is not None and abs(r["moves_pct"]) >= MOVES_PCT:
            groups.setdefault((r["host"], r["model"]), []).append(r["wanted_us"])
    return [{"host": h, "model": m, "rows": len(v), "median_wanted_us": statistics.median(v),
             "range_us": (min(v), max(v))} for (h, m), v in sorted(groups.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    args = parser.parse_args()
    rows = measure()
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary(rows)}, indent=1))
        return
    print("| run | host | asks for (us) | error at the shipped value | moves 65 -> 85 us |")
    print("| --- | --- | ---: | ---: | ---: |")
    for r in rows:
        want = "none in 1-400" if r["wanted_us"] is None else f"{r['wanted_us']:.0f}"
        print(f"| {r['name']} | {r['host']} | {want} | {r['error_pct']:+.1f}% | {r['moves_pct']:+.1f} pts |")
    print("\n| host | model | rows that move | median asked (us) | range (us) |")
    print("| --- | --- | ---: | ---: | --- |")
    for s in summary(rows):
        print(f"| {s['host']} | {s['model']} | {s['rows']} | {s['median_wanted_us']:.0f} | "
              f"{s['range_us'][0]:.0f}-{s['range_us'][1]:.0f} |")


if __name__ == "__main__":
    main()
