"""echo-tune's fused-attention time against cuDNN's own training SDPA benchmark, kernel by kernel.

The attention efficiencies of every GPU preset (``cost/datasheet_efficiencies.py``: forward 0.61, backward 0.50, a
causal forward at 0.85 of that, bounded by the GPU's exponential rate) were read off H100 figures of the
FlashAttention-3 paper. NVIDIA's cudnn-frontend publishes what its training SDPA kernels take on H200, GB200 and
GB300 (``benchmark/sdpa_benchmark_training/results/``; the rows used, BF16 at 4,096 and 8,192 tokens, are copied with
their source into ``benchmarks/data/cudnn_sdpa_training/sdpa_bf16.csv``). For each row this traces the attention of a
layer of that shape (Megatron's causal self-attention of the ``llama3.1`` rows; DeepSeek-V3's MLA, q/k 192 and v 128,
of the ``dsv3`` rows; a sliding-window layer of the ``gpt_oss`` rows), times its forward or backward kernel with the
GPU preset's default profile (``cost/kernels/compute.py op_time_s``) and prints the ratio. ``no_mask`` rows, which
Megatron's GPT layers never run, take the traced causal kernel with the mask off (twice the FLOPs and exponentials).

Two model columns: at the preset's sustained clock (what a training step is timed at) and at its peak clock. The
benchmark does not state the clock its ten iterations ran at; a short loop of 0.2-4 ms kernels runs near the boost
clock, so the peak-clock column is the like-for-like one. Not a test; tests/benchmarks/test_attention_vs_cudnn.py
keeps what it found, docs/moe_experiments.md reads it.

    python benchmarks/attention_vs_cudnn.py [--json]
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from echo_tune.config.load.loading import load_cluster, load_model  # noqa: E402
from echo_tune.cost.kernels.compute import op_time_s  # noqa: E402
from echo_tune.sim.schedule.memo import profile_for_cluster  # noqa: E402
from echo_tune.workload.tracer import trace_layer, trace_window_layer  # noqa: E402

DATA = REPO / "benchmarks" / "data" / "cudnn_sdpa_training" / "sdpa_bf16.csv"
CLUSTERS = {"h200-sxm": "h200-sxm", "gb200": "gb200-nvl72", "gb300": "gb300-nvl72"}
"""The cluster preset of each benchmark GPU (its GPU preset and default profile)."""


def read_rows(path: Path = DATA) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _model(row: dict):
    """A model whose layer runs the benchmark's attention shape (a dense layer: only its attention kernel is used)."""
    seq, heads, groups = int(row["seq"]), int(row["q_heads"]), int(row["kv_heads"])
    if row["config"] == "dsv3":
        return dataclasses.replace(load_model("deepseek-v3"), seq_length=seq, num_experts=None, mtp_num_layers=None)
    base = load_model("llama3-70b")
    model = dataclasses.replace(base, seq_length=seq, num_attention_heads=heads, num_query_groups=groups,
                                kv_channels=int(row["head_dim_qk"]), hidden_size=heads * int(row["head_dim_qk"]))
    if row["window"]:
        model = dataclasses.replace(model, window_size=int(row["window"]))
    return model


def attention_op(row: dict):
    """The traced attention kernel of the row's pass (forward or backward), with the mask as the row ran it."""
    model, batch = _model(row), int(row["batch"])
    trace = (trace_window_layer if row["window"] else trace_layer)(model, tensor_model_parallel_size=1,
                                                                  micro_batch_size=batch)
    ops = trace.forward if row["pass"] == "fwd" else trace.backward
    (op,) = [o for o in ops if o.kind == "attention"]
    if row["mask"] == "no_mask":  # the whole score matrix: twice the causal half's work
        op = dataclasses.replace(op, causal=False, flops=2 * op.flops, exps=2 * op.exps)
    return op


def measure(rows: list[dict] | None = None) -> list[dict]:
    out = []
    for row in rows or read_rows():
        cluster = load_cluster(CLUSTERS[row["gpu"]])
        profile = profile_for_cluster(cluster)
        op = attention_op(row)
        at_peak = dataclasses.replace(cluster.gpu, sustained_clock_mhz=cluster.gpu.peak_clock_mhz)
        sustained_ms = 1e3 * op_time_s(op, profile, cluster.gpu, "bf16")
        peak_ms = 1e3 * op_time_s(op, profile, at_peak, "bf16")
        measured_ms = float(row["time_ms"])
        out.append({**{k: row[k] for k in ("gpu", "config", "mask", "batch", "seq", "q_heads", "kv_heads",
                                            "head_dim_qk", "head_dim_vo", "window", "pass")},
                    "measured_ms": measured_ms, "model_sustained_ms": sustained_ms, "model_peak_ms": peak_ms,
                    "ratio_sustained": sustained_ms / measured_ms, "ratio_peak": peak_ms / measured_ms})
    return out


def summary(rows: list[dict]) -> list[dict]:
    """Median model / measured per (GPU, config, pass)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["gpu"], r["config"], r["pass"]), []).append(r)
    return [{"gpu": g, "config": c, "pass": p, "rows": len(v),
             "median_ratio_sustained": statistics.median(r["ratio_sustained"] for r in v),
             "median_ratio_peak": statistics.median(r["ratio_peak"] for r in v)}
            for (g, c, p), v in sorted(groups.items())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    args = parser.parse_args()
    rows = measure()
    if args.json:
        print(json.dumps({"rows": rows, "summary": summary(rows)}, indent=1))
        return
    print("| GPU | config | mask | b x s | heads q / kv | d qk / vo | window | pass | cuDNN ms | model ms (sustained) "
          "| model / cuDNN | model / cuDNN at peak clock |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['gpu']} | {r['config']} | {r['mask']} | {r['batch']} x {r['seq']} | {r['q_heads']} / "
              f"{r['kv_heads']} | {r['head_dim_qk']} / {r['head_dim_vo']} | {r['window'] or '-'} | {r['pass']} | "
              f"{r['measured_ms']:.3f} | {r['model_sustained_ms']:.3f} | {r['ratio_sustained']:.2f} | "
              f"{r['ratio_peak']:.2f} |")
    print("\n| GPU | config | pass | rows | median model / cuDNN (sustained) | at peak clock |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for s in summary(rows):
        print(f"| {s['gpu']} | {s['config']} | {s['pass']} | {s['rows']} | {s['median_ratio_sustained']:.2f} | "
              f"{s['median_ratio_peak']:.2f} |")


if __name__ == "__main__":
    main()
