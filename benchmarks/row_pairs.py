"""Published runs in pairs that differ in one thing: the measured ratio against the simulated one.

A row's error mixes everything the model gets wrong about it; two rows of one table that differ in one setting (the
FP8 recipe, the GPU, the micro-batch size, token dropping) cancel what they share, so the ratio of their step times per
token isolates what that one setting does. Where the simulated ratio misses the measured one, the mechanism behind
that setting is what is wrong, not a constant. Each pair is printed with its measured ratio (A / B, time per token and
GPU), the simulated ratio with the default profiles, and the simulated ratio with the host time per kernel set to 0
(the GPU side alone, ``cost/host/host_bound.py``), and each row's own error. Not a test, a measurement.

    python benchmarks/row_pairs.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from echo_tune.cost.host.host_time import without_host  # noqa: E402
from echo_tune.sim.schedule.memo import profile_for_cluster  # noqa: E402
from echo_tune.sim.simulate import simulate  # noqa: E402
from echo_tune.validate.datasets import DATASETS, published_runs  # noqa: E402
from echo_tune.validate.runs import read_runs  # noqa: E402

# (A, B, what differs): rows of the shipped sets (calibration/published-runs/); everything else as the rows state it.
PAIRS = (
    ("mb2509-qwen3-235b-a22b-fp8-tokendrop-64xb200", "mb2509-qwen3-235b-a22b-mxfp8-tokendrop-64xb200",
     "FP8 current scaling vs MXFP8, same layout, no CUDA graphs, no host sync (drop-and-pad)"),
    ("mb2509-deepseek-v3-fp8-tokendrop-256xb200", "mb2509-deepseek-v3-mxfp8-tokendrop-256xb200",
     "FP8 current scaling vs MXFP8, same layout, no CUDA graphs, no host sync (drop-and-pad)"),
    ("mb2509-qwen3-30b-a3b-fp8-tokendrop-8xgb200", "mb2509-qwen3-30b-a3b-mxfp8-tokendrop-8xgb200",
     "FP8 current scaling vs MXFP8, same layout, whole layers in CUDA graphs"),
    ("mb2509-llama31-405b-fp8-128xb200", "mb2509-llama31-405b-mxfp8-128xb200",
     "FP8 current scaling vs MXFP8, dense, same layout"),
    ("mb2511-qwen3-30b-a3b-mxfp8-8xb200", "mb2509-qwen3-30b-a3b-fp8-tokendrop-8xb200",
     "dropless (host sync per layer, router graphs) vs drop-and-pad (whole layers in CUDA graphs), MBS 1"),
    ("mb2602-qwen3-30b-a3b-fp8cs-16xh100", "mb2511-qwen3-30b-a3b-fp8cs-16xh100",
     "H100, MBS 1 VP 12: DeepEP, GBS 1,024 (26.02) vs all-to-all, GBS 512 (25.11; the table's MBS 2 / VP 24 an erratum)"),
    ("mb2511-qwen3-30b-a3b-fp8cs-16xh100", "mb2511-qwen3-30b-a3b-mxfp8-8xb200",
     "H100 (16, PP 2, EP overlap) vs B200 (8, router graphs), MBS 1, dropless: per token and GPU"),
    ("mb2602-llama3-70b-fp8cs-64xgb300", "mb2602-llama3-70b-fp8cs-64xgb200",
     "GB300 vs GB200, same layout, dense FP8: same FP8 datasheet peak"),
    ("mb2602-qwen3-30b-a3b-mxfp8-8xgb300", "mb2602-qwen3-30b-a3b-mxfp8-8xgb200",
     "GB300 (MBS 8) vs GB200 (MBS 4), fine-grained MoE, HybridEP"),
    ("mb2602-gpt-oss-120b-bf16-64xgb200", "mb2602-gpt-oss-120b-bf16-64xb200",
     "GB200 (EP 64 in one NVLink rack) vs B200 (EP 64 over 8 nodes)"),
    ("mb2509-qwen3-30b-a3b-fp8-tokendrop-8xgb200", "mb2509-qwen3-30b-a3b-fp8-tokendrop-8xb200",
     "GB200 MBS 4 vs B200 MBS 1, drop-and-pad, whole layers in CUDA graphs (no host in either): per micro-batch "
     "against per token"),
)


def _cases() -> dict:
    return {case.name: case for dataset in DATASETS for case in read_runs(published_runs(dataset))}


def _without_host(case):
    return without_host(profile_for_cluster(case.cluster))


def _per_token_s(case, step_s: float) -> float:
    """Step time per token a GPU processes."""
    return step_s * case.num_gpus / (case.parallel.global_batch_size * case.model.seq_length)


def measure() -> list[dict]:
    cases, rows = _cases(), []
    for a_name, b_name, what in PAIRS:
        a, b = cases[a_name], cases[b_name]
        out = {"a": a_name, "b": b_name, "differs": what}
        for key, profile_of in (("default", lambda c: None), ("gpu_only", _without_host)):
            steps = [simulate(c.model, c.cluster, c.num_gpus, c.parallel, profile=profile_of(c)).step_time_s
                     for c in (a, b)]
            out[f"{key}_ratio"] = _per_token_s(a, steps[0]) / _per_token_s(b, steps[1])
            out[f"{key}_errors_pct"] = [100 * (s / c.measured_step_time_s - 1) for s, c in zip(steps, (a, b))]
        out["measured_ratio"] = _per_token_s(a, a.measured_step_time_s) / _per_token_s(b, b.measured_step_time_s)
        rows.append(out)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = measure()
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| A / B | differs | measured | simulated | GPU side only | errors A, B (default) |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for r in rows:
        ea, eb = r["default_errors_pct"]
        print(f"| {r['a']} / {r['b']} | {r['differs']} | {r['measured_ratio']:.2f} | {r['default_ratio']:.2f} | "
              f"{r['gpu_only_ratio']:.2f} | {ea:+.1f}%, {eb:+.1f}% |")


if __name__ == "__main__":
    main()
