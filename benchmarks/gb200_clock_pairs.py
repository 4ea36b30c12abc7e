"""GB200's sustained clock from the published runs that ran one recipe and layout on both B200 and GB200.

No public measurement of the SM clock a GB200 holds under a training step's power draw was found. Megatron-Bridge's
25.09 and 25.11 tables ran the same Llama3-8B recipe (TP1, MBS 2, GBS 128, FP8 current scaling and MXFP8) on 8 B200
and 8 GB200: the same die, so what separates the two step times is GB200's clock (and its host, which these
GPU-bound dense rows do not wait on). This script simulates each pair with B200 at its measured sustained clock
(1,580 MHz, flashinfer PR 2899) and GB200 at a range of clocks, and prints the simulated GB200 / B200 step ratio over
the measured one; the preset (config/presets/gpus.yaml) takes the clock where their geometric mean is 1. Not a test,
a measurement (tests/benchmarks/test_gb200_clock_pairs.py checks the preset against it).

    python benchmarks/gb200_clock_pairs.py [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from echo_tune.config.load.loading import load_gpu  # noqa: E402
from echo_tune.sim.simulate import simulate  # noqa: E402
from echo_tune.validate.datasets import published_runs  # noqa: E402
from echo_tune.validate.runs import read_runs  # noqa: E402

SETS = ("runs_bridge.csv", "runs_bridge_2025.csv")
# (GB200 row, B200 row): the same recipe, layout and table
PAIRS = (("mb2509-llama3-8b-fp8-8xgb200", "mb2509-llama3-8b-fp8-8xb200"),
         ("mb2509-llama3-8b-mxfp8-8xgb200", "mb2509-llama3-8b-mxfp8-8xb200"),
         ("mb2511-llama3-8b-fp8cs-8xgb200", "mb2511-llama3-8b-fp8cs-8xb200"),
         ("mb2511-llama3-8b-mxfp8-8xgb200", "mb2511-llama3-8b-mxfp8-8xb200"))
CLOCKS_MHZ = tuple(range(1560, 1781, 20))


def _cases() -> dict:
    return {c.name: c for name in SETS for c in read_runs(published_runs(name))}


def _step_s(case, clock_mhz: float | None = None) -> float:
    cluster = case.cluster if clock_mhz is None else case.cluster.replace(sustained_clock_mhz=float(clock_mhz))
    return simulate(case.model, cluster, case.num_gpus, case.parallel).step_time_s


def measure(clocks_mhz=CLOCKS_MHZ) -> dict:
    """Per pair the measured GB200 / B200 step ratio; per GB200 clock the simulated over measured ratio of each pair
    and their geometric mean; the clock (to 1 MHz, interpolated) where that mean is 1; the preset's clock and its
    pairs."""
    cases = _cases()
    measured = {a: cases[a].measured_step_time_s / cases[b].measured_step_time_s for a, b in PAIRS}
    b200 = {b: _step_s(cases[b]) for _, b in PAIRS}

    def sim_over_measured(clock_mhz):
        each = {a: _step_s(cases[a], clock_mhz) / b200[b] / measured[a] for a, b in PAIRS}
        return each, math.exp(sum(math.log(v) for v in each.values()) / len(each))

    table = []
    for clock in clocks_mhz:
        each, mean = sim_over_measured(clock)
        table.append({"clock_mhz": clock, "mean": mean, "pairs": each})
    matched = None
    for lo, hi in zip(table, table[1:]):  # the mean falls as the clock rises
        if (lo["mean"] - 1) * (hi["mean"] - 1) <= 0:
            t = (lo["mean"] - 1) / (lo["mean"] - hi["mean"])
            matched = round(lo["clock_mhz"] + t * (hi["clock_mhz"] - lo["clock_mhz"]))
    preset = load_gpu("gb200").sustained_clock_mhz
    each, mean = sim_over_measured(preset)
    return {"measured": measured, "table": table, "matched_clock_mhz": matched,
            "preset": {"clock_mhz": preset, "mean": mean, "pairs": each}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    out = measure()
    if parser.parse_args().json:
        print(json.dumps(out, indent=2))
        return
    print("measured GB200 / B200 step: " + ", ".join(f"{a}: {v:.3f}" for a, v in out["measured"].items()))
    print("| GB200 clock (MHz) | simulated / measured, geometric mean | per pair |")
    print("| ---: | ---: | --- |")
    for row in out["table"]:
        print(f"| {row['clock_mhz']} | {row['mean']:.4f} | " + ", ".join(f"{v:.3f}" for v in row["pairs"].values())
              + " |")
    p = out["preset"]
    print(f"matched at {out['matched_clock_mhz']} MHz; the preset's {p['clock_mhz']:.0f} MHz gives {p['mean']:.4f} "
          f"(" + ", ".join(f"{v:.3f}" for v in p["pairs"].values()) + ")")


if __name__ == "__main__":
    main()
