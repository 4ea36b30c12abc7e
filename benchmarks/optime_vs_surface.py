"""Measured op times (an op-time database) next to the fitted / datasheet surface, for one layout.

    python benchmarks/optime_vs_surface.py --model llama3-8b --cluster h100-sxm --num-gpus 8 \
        --profile calibration/h100-sxm/profile-optime.yaml --tp 2 --pp 4 --global-batch-size 8

Prints, per op kind and for the ten costliest ops of one layer (forward + backward), the measured time
and the time the cluster's own profile (datasheet-derived unless calibrated) gives, and the simulated
step with and without the measured times.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections import defaultdict

import echo_tune as et
from echo_tune.cost.kernels.compute import op_time_s
from echo_tune.sim.schedule.passes import trace_pieces


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--num-gpus", type=int, required=True)
    parser.add_argument("--profile", required=True, help="profile whose op_times points at the database")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--global-batch-size", type=int, required=True)
    parser.add_argument("--precision", default="bf16")
    args = parser.parse_args()
    model, cluster = et.load_model(args.model), et.load_cluster(args.cluster)
    measured = et.load_profile(args.profile)
    surface = dataclasses.replace(et.profile_for(cluster), op_times=None)
    layout = et.ParallelConfig(tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp,
                               global_batch_size=args.global_batch_size, precision=args.precision)
    checked = et.check_compatible(model, cluster, args.num_gpus, layout)
    layer = trace_pieces(model, layout, checked)["layer"]
    ops = [op for op in layer.forward + layer.backward if op.kind != "collective"]
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    rows = []
    for op in ops:
        m = measured.op_times.times.get(op.key)
        s = op_time_s(op, surface, cluster.gpu, args.precision)
        entry = by_kind[op.kind]
        entry[1] += s
        if m is not None:
            entry[0] += m
            entry[2] += 1
            rows.append((m, s, op))
    print(f"{model.name} layer, TP{args.tp}, {args.precision}, on {measured.op_times.device} "
          f"vs {surface.name} ({surface.label})")
    print(f"{'op kind':<12}{'ops measured':>14}{'measured':>14}{'surface':>14}{'meas/surf':>11}")
    for kind, (m, s, n) in sorted(by_kind.items()):
        print(f"{kind:<12}{n:>14}{m * 1e3:>12.3f}ms{s * 1e3:>12.3f}ms{(m / s if s else 0):>11.2f}")
    print(f"\n{'costliest measured ops':<48}{'measured':>12}{'surface':>12}")
    for m, s, op in sorted(rows, key=lambda r: -r[0])[:10]:
        shape = "x".join(map(str, op.gemm_mnk)) if op.gemm_mnk else ""
        print(f"{op.phase} {op.name:<30}{shape:>14}{m * 1e6:>10.1f}us{s * 1e6:>10.1f}us")
    with_db = et.simulate(model, cluster, args.num_gpus, layout, profile=measured)
    without = et.simulate(model, cluster, args.num_gpus, layout, profile=surface)
    print(f"\nsimulated step: {with_db.step_time_s:.4f} s with measured ops "
          f"({with_db.measured_compute_share:.1%} of compute measured), {without.step_time_s:.4f} s with the surface")


if __name__ == "__main__":
    main()
