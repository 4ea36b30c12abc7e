"""Time one simulation (median of repeats, traces already cached) for the issue's reference layout.

    python benchmarks/simulate_speed.py [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import echo_tune as et


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    start = time.perf_counter()
    et.simulate  # noqa: B018  the simulator's import: torch and the tracer
    print(f"import of the simulator (torch included): {time.perf_counter() - start:.2f} s")
    model, cluster = et.load_model("gpt3-175b"), et.load_cluster("a100-80gb")
    layouts = {
        "TP8 PP16 full recompute (1F1B, m=192)": et.ParallelConfig(
            tensor_model_parallel_size=8, pipeline_model_parallel_size=16, global_batch_size=1536,
            recompute_granularity="full"),
        "TP8 PP16 v3 SP dist-opt overlap (m=192)": et.ParallelConfig(
            tensor_model_parallel_size=8, pipeline_model_parallel_size=16, virtual_pipeline_model_parallel_size=3,
            global_batch_size=1536, recompute_granularity="selective", sequence_parallel=True,
            use_distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True),
        "TP4 PP8 DP32 (m=48)": et.ParallelConfig(
            tensor_model_parallel_size=4, pipeline_model_parallel_size=8, global_batch_size=1536,
            recompute_granularity="full"),
    }
    for name, parallel in layouts.items():
        start = time.perf_counter()
        et.simulate(model, cluster, 1024, parallel)
        first_s = time.perf_counter() - start
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            report = et.simulate(model, cluster, 1024, parallel)
            times.append(time.perf_counter() - start)
        print(f"{name:42s} step {report.step_time_s:7.3f} s | first call (incl. tracing) {first_s * 1e3:7.1f} ms | "
              f"median {statistics.median(times) * 1e3:6.2f} ms per simulation over {args.repeats}")


if __name__ == "__main__":
    main()
