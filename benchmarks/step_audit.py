"""Audit of the modelled work of one H100 training step against the measured step (no fitting).

    python benchmarks/step_audit.py [ROW ...]          # ROW: a runs_modern.csv name, or CSV:NAME
    python benchmarks/step_audit.py --gemm-needed       # every H100 row: the GEMM efficiency that meets it
    python benchmarks/step_audit.py --readme-interleaved  # Megatron README H100 rows with PP > 1, interleaved

For each row (default: the two dense configs of the audit, Llama-3.1 8B TP1 CP2 seq 8192 and GPT-3 175B
TP4 PP8 VP12 seq 2048, plus the two small H100 rows of runs_megatron.csv) it prints:

1. the predicted step, its named parts and the gap to the measured step;
2. the traced work of one micro-batch of one layer by kind (GEMM, fused attention, memory-bound, kernel
   launches), with the number of kernels;
3. sensitivities, by re-simulating with one cost coefficient changed: how much slower each kind must run
   (uniformly, on every row alike) for the prediction to meet the measurement;
4. candidate work the trace may lack, each sized by a first-principles count:
   - RoPE fwd/bwd on q and k, RMSNorm and untied embeddings for Llama rows (the CSV has no columns for
     them, so the rows run as learned-absolute / LayerNorm / tied): re-simulated with them set;
   - gradient-accumulation fusion (Megatron's default): the weight-gradient GEMMs accumulate into the
     main_grad buffer (read + write in its dtype instead of one bf16 write), an upper bound that
     assumes none of the extra epilogue traffic overlaps the GEMM's main loop;
   - host time: kernels per layer times a measured PyTorch launch cost (11.3-17.7 us per tiny GEMM from
     Python in NVIDIA/dgxc-benchmarking microbenchmarks/cpu_overhead/README.md example output) against
     the GPU time of the same layer: the GPU starves only when the host is slower.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.cost.profile import profile_for
from echo_tune.sim.data_parallel.dp import grad_bytes_per_param
from echo_tune.sim.schedule.passes import trace_pieces
from echo_tune.sim.simulate import simulate
from echo_tune.validate.runs import read_runs
from echo_tune.validate.datasets import PUBLISHED_RUNS_DIR

DATA = PUBLISHED_RUNS_DIR
DEFAULT_ROWS = (("runs_modern.csv", "dgxc2411-llama31-8b-bf16-8gpu"),
                ("runs_modern.csv", "dgxc2411-gpt3-175b-bf16-128gpu"),
                ("runs_megatron.csv", "row41-GPT-1.7B"), ("runs_megatron.csv", "row42-GPT-7.1B"))
HOST_LAUNCH_S = (11.3e-6, 17.7e-6)
"""Python-issued launch cost of one small PyTorch GEMM, min and max of the dgxc-benchmarking example output."""


def _case(csv: str, name: str):
    return next(c for c in read_runs(DATA / csv) if c.name == name)


def _step(case, profile=None, model=None) -> float:
    return simulate(model or case.model, case.cluster, case.num_gpus, case.parallel, profile=profile).step_time_s


def _layer_by_kind(case, profile):
    layout = check_compatible(case.model, case.cluster, case.num_gpus, case.parallel)
    pieces = trace_pieces(case.model, case.parallel, layout)
    layer = pieces.get("layer") or pieces.get("moe_layer")
    kinds: dict[str, list[float]] = {}
    for op in layer.forward + layer.backward:
        if op.kind == "collective":
            continue
        t = op_time_s(op, profile, case.cluster.gpu, case.parallel.precision) - profile.kernel_launch_overhead_s
        entry = kinds.setdefault(op.kind, [0, 0.0])
        entry[0] += 1
        entry[1] += t
    launches = sum(n for n, _ in kinds.values())
    kinds["launch"] = [launches, launches * profile.kernel_launch_overhead_s]
    return layout, layer, kinds


def _scale_needed(case, profile, field: str, measured: float) -> float | None:
    """Factor on ``field`` (an efficiency or bandwidth) at which the prediction meets the measurement."""
    lo, hi = 0.3, 1.0
    base = getattr(profile, field)
    if _step(case, dataclasses.replace(profile, **{field: base * lo})) < measured:
        return None
    for _ in range(30):
        mid = (lo + hi) / 2
        if _step(case, dataclasses.replace(profile, **{field: base * mid})) > measured:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def audit(csv: str, name: str) -> None:
    case = _case(csv, name)
    profile = profile_for(case.cluster)
    report = simulate(case.model, case.cluster, case.num_gpus, case.parallel, profile=profile)
    measured, predicted = case.measured_step_time_s, report.step_time_s
    gap = measured - predicted
    print(f"\n== {name} ({csv})\n   measured {measured:.3f} s, predicted {predicted:.3f} s, "
          f"error {100 * (predicted - measured) / measured:+.1f}%, gap {gap:+.3f} s; MFU predicted {report.mfu:.3f}")
    print("   parts: " + ", ".join(f"{k} {v:.3f}" for k, v in report.breakdown_s.items() if v))
    layout, layer, kinds = _layer_by_kind(case, profile)
    total = sum(t for _, t in kinds.values())
    print(f"   one layer, one micro-batch, fwd+bwd: {total * 1e3:.2f} ms in {kinds['launch'][0]} kernels: " +
          ", ".join(f"{k} {t * 1e3:.2f} ms ({100 * t / total:.0f}%)" for k, (_, t) in kinds.items()))

    print("   uniform slow-down that would close the gap (re-simulated):")
    for field, what in (("gemm_max_efficiency", "GEMM efficiency"), ("memory_bandwidth_gbyte_s", "HBM bandwidth"),
                        ("attention_efficiency", "attention fwd efficiency")):
        if field == "attention_efficiency" and "attention" not in kinds:
            continue
        factor = _scale_needed(case, profile, field, measured) if gap > 0 else None
        text = "not reachable alone (> 3.3x slower)" if factor is None else \
            f"x{factor:.3f} (= {getattr(profile, field) * factor:.3g})"
        print(f"     {what:26s} {text if gap > 0 else 'n/a: predicted too slow'}")

    print("   candidate missing work (first-principles counts):")
    m = case.model
    if m.swiglu and m.position_embedding_type != "rope":
        llama = m.replace(position_embedding_type="rope", normalization="RMSNorm",
                          untie_embeddings_and_output_weights=True)
        step = _step(case, profile, llama)
        print(f"     RoPE + RMSNorm + untied embeddings (Llama as Meta defines it): {step - predicted:+.3f} s "
              f"({100 * (step - predicted) / measured:+.2f}% of measured)")
    layers_on_stage = max(max(row) for row in layout.stage_chunk_layers) * layout.virtual_pipeline_size
    weights = sum(layer.linear_param_counts.values())
    grad_bytes = grad_bytes_per_param(case.parallel)
    extra_bytes = weights * (2 * grad_bytes - 2)  # read + write main_grad instead of one bf16 output write
    serial_s = extra_bytes / (profile.memory_bandwidth_gbyte_s * 1e9) * layers_on_stage * layout.num_micro_batches
    print(f"     gradient-accumulation fusion ({grad_bytes:.0f}-byte main_grad) on {weights / 1e6:.0f}M linear "
          f"weights per layer: <= {serial_s:.3f} s if never overlapped ({100 * serial_s / measured:.1f}% of "
          f"measured); 0 under the roofline (each weight-gradient GEMM is compute-bound)")
    host = [kinds["launch"][0] * c for c in HOST_LAUNCH_S]
    low_us, high_us = (c * 1e6 for c in HOST_LAUNCH_S)
    print(f"     host: {kinds['launch'][0]} kernels per layer x {low_us:.1f}-{high_us:.1f} us "
          f"= {host[0] * 1e3:.2f}-{host[1] * 1e3:.2f} ms vs {total * 1e3:.2f} ms of GPU work: "
          f"{'host-bound' if host[1] > total else 'GPU-bound (host runs ahead)'}")


def gemm_needed() -> None:
    """Per H100 row: the GEMM efficiency (bf16 and FP8 scaled together) at which the prediction meets the
    measurement, if every other coefficient stays; rows predicted too slow print the factor above 1."""
    print(f"{'row':44s} {'error %':>8s} {'factor':>7s} {'bf16 eff':>9s}")
    for csv in ("runs_modern.csv", "runs_megatron.csv"):
        for case in read_runs(DATA / csv):
            if case.error or case.cluster.gpu.name != "h100-sxm":
                continue
            profile = profile_for(case.cluster)
            measured = case.measured_step_time_s
            predicted = _step(case, profile)

            def scaled(f: float):
                return dataclasses.replace(profile, gemm_max_efficiency=min(1.0, profile.gemm_max_efficiency * f),
                                           fp8_gemm_max_efficiency=min(1.0, profile.fp8_gemm_max_efficiency * f))
            lo, hi = (0.3, 1.0) if predicted < measured else (1.0, 1.25)
            for _ in range(25):
                mid = (lo + hi) / 2
                lo, hi = (mid, hi) if _step(case, scaled(mid)) > measured else (lo, mid)
            factor = (lo + hi) / 2
            print(f"{case.name:44s} {100 * (predicted - measured) / measured:+8.1f} {factor:7.3f} "
                  f"{profile.gemm_max_efficiency * factor:9.3f}")


def readme_interleaved() -> None:
    """The Megatron-LM README's H100 rows with PP > 1 under the interleaved schedule, which their text implies.

    The README (f2e5db402c) says pipeline-parallel communication is overlapped "(enabled by default)", and
    Megatron-LM at that commit turns --overlap-p2p-communication off, with a warning, unless the interleaved
    schedule is used (megatron/training/arguments.py, validate_args), so those runs were interleaved. The
    number of chunks is not stated: every valid one (a divisor > 1 of the layers per stage) is a candidate,
    and the rows print the error at the fewest and at the most chunks (the CSV assumes one)."""
    print(f"{'row':18s} {'PP':>3s} {'layers/stage':>12s} {'CSV (VP 1)':>10s} {'fewest chunks':>16s} "
          f"{'most chunks':>14s}")
    for case in read_runs(DATA / "runs_megatron.csv"):
        pp = case.parallel.pipeline_model_parallel_size
        if case.error or case.cluster.gpu.name != "h100-sxm" or pp == 1:
            continue
        per_stage = case.model.num_layers // pp
        chunks = [v for v in range(2, per_stage + 1) if per_stage % v == 0]

        def error(vp: int | None) -> float:
            parallel = dataclasses.replace(case.parallel, virtual_pipeline_model_parallel_size=vp)
            step = simulate(case.model, case.cluster, case.num_gpus, parallel).step_time_s
            return 100 * (step - case.measured_step_time_s) / case.measured_step_time_s
        print(f"{case.name:18s} {pp:3d} {per_stage:12d} {error(None):+9.1f}% "
              f"{error(chunks[0]):+8.1f}% (VP {chunks[0]:2d}) {error(chunks[-1]):+7.1f}% (VP {chunks[-1]:2d})")


def main() -> None:
    if sys.argv[1:] == ["--gemm-needed"]:
        gemm_needed()
        return
    if sys.argv[1:] == ["--readme-interleaved"]:
        readme_interleaved()
        return
    rows = [a.split(":", 1) if ":" in a else ("runs_modern.csv", a) for a in sys.argv[1:]] or DEFAULT_ROWS
    for csv, name in rows:
        audit(csv, name)


if __name__ == "__main__":
    main()
