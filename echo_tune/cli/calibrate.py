"""``echo-tune calibrate fit|check|predict``: fit a profile, check it on an unseen log, or predict a group."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from echo_tune.cli.common import print_json
from echo_tune.console import make_console
from rich.table import Table

from echo_tune.calibrate.fit.check import check_log, extrapolation_warnings, placement_for, predict_us
from echo_tune.calibrate.fit.results import FitResult
from echo_tune.cli.calibrate_runs import add_run_arguments, run_fit_runs, wants_runs
from echo_tune.config.load.loading import load_cluster
from echo_tune.cost.collectives.comm import COLLECTIVES, bus_factor
from echo_tune.cost.profile import load_profile, profile_for, profile_warnings, save_profile
from echo_tune.errors import ConfigError
from echo_tune.io_targets import stream_target


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("calibrate", help="fit a calibration profile and check its predictions",
                                   description="Fit the cost models to bench output and nccl-tests logs (fit), "
                                               "compare a profile with a log it was not fitted on (check), or "
                                               "predict collective times for a group size (predict).")
    sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    fit = sub.add_parser("fit", help="fit a profile (least squares) and write it as YAML")
    fit.add_argument("--cluster", help="cluster preset or YAML file (datasheet values and layout); with --runs the "
                                       "rows name their own")
    fit.add_argument("--nccl-tests", nargs="+", default=[], metavar="LOG", help="nccl-tests logs to fit")
    fit.add_argument("--bench", metavar="DIR", help="output folder of `echo-tune bench` (calibration/<name>)")
    fit.add_argument("--out", required=True, metavar="PROFILE.yaml", help="profile to write")
    fit.add_argument("--name", help="profile name (default <cluster>-fitted)")
    fit.add_argument("--max-tiers", type=int, choices=(1, 2, 3), default=None,
                     help="most protocol tiers per collective (default: chosen by BIC, up to 3)")
    fit.add_argument("--show-points", action="store_true", help="print every point's residual")
    fit.add_argument("--allow-gpu-mismatch", action="store_true",
                     help="use logs whose GPU is not the cluster's GPU (refused by default)")
    fit.add_argument("--allow-cpu-bench", action="store_true",
                     help="fit a GPU cluster from a CPU (gloo) bench; the profile and every report then say so")
    fit.add_argument("--json", action="store_true",
                     help="print one JSON object (profile written, fit quality per quantity, warnings) instead of tables")
    add_run_arguments(fit)
    fit.set_defaults(run=run_fit)
    check = sub.add_parser("check", help="compare a profile's predictions with an nccl-tests log")
    check.add_argument("--cluster", required=True, help="cluster preset or YAML file")
    check.add_argument("--profile", help="profile YAML (default: the cluster's own, else its datasheet values)")
    check.add_argument("--nccl-tests", required=True, nargs="+", metavar="LOG", help="logs to compare with")
    check.add_argument("--json", action="store_true", help="print JSON (one object per log)")
    check.add_argument("--max-error-pct", type=float, metavar="X",
                       help="exit 1 when a point of 1 MiB or more is off by more than X percent")
    check.add_argument("--allow-gpu-mismatch", action="store_true",
                       help="check logs whose GPU is not the cluster's GPU (refused by default)")
    check.set_defaults(run=run_check)
    predict = sub.add_parser("predict", help="predicted collective times for a group of whole nodes")
    predict.add_argument("--cluster", required=True, help="cluster preset or YAML file")
    predict.add_argument("--profile", help="profile YAML (default: the cluster's own, else its datasheet values)")
    predict.add_argument("--collective", default="all_reduce", choices=COLLECTIVES,
                         help="collective to predict (default all_reduce)")
    predict.add_argument("--num-gpus", type=int, required=True, nargs="+", help="group sizes to predict for")
    predict.add_argument("--json", action="store_true", help="print one JSON object")
    predict.set_defaults(run=run_predict)


def _fmt(value: float | None, spec: str = ".1%") -> str:
    return "-" if value is None else format(value, spec)


def _params_text(result: FitResult) -> str:
    """One line per coefficient group; protocol tiers as "name: base + step x n, bandwidth"."""
    parts = []
    for key, value in result.params.items():
        if isinstance(value, dict) and "bus_bandwidth_gbyte_s" in value:
            parts.append(f"{key}: {value['base_latency_us']:.3g} us + {value['step_latency_us']:.3g} us/step, "
                         f"{value['bus_bandwidth_gbyte_s']:.4g} GB/s"
                         + (f", tree x{value['tree_efficiency']:.3g}" if "tree_efficiency" in value else ""))
        elif isinstance(value, (int, float)):
            parts.append(f"{key}={value:g}")
        else:
            parts.append(f"{key}={value}")
    return "\n".join(parts)


def fit_table(results: list[FitResult]) -> Table:
    table = Table(title="calibration fit quality (relative error = (predicted - measured) / measured)")
    for column in ("quantity", "method", "points", "rms error", "max error", "coefficients"):
        table.add_column(column, justify="right" if column in ("points", "rms error", "max error") else "left")
    for r in results:
        style = "red" if r.warnings and r.method == "least squares" else None
        table.add_row(r.quantity, r.method, str(len(r.points)), _fmt(r.rms_relative_error),
                      _fmt(r.max_relative_error), _params_text(r), style=style)
    return table


def points_table(results: list[FitResult]) -> Table:
    table = Table(title="residual per point")
    for column in ("quantity", "source", "point", "measured", "predicted", "error"):
        table.add_column(column)
    for r in results:
        for p in r.points:
            table.add_row(p.quantity, p.source, p.label, f"{p.measured:.4g} {p.unit}", f"{p.predicted:.4g} {p.unit}",
                          f"{p.relative_error:+.1%}")
    return table


def run_fit(args: argparse.Namespace) -> int:
    if wants_runs(args):
        return run_fit_runs(args)
    if not args.cluster:
        raise ConfigError("`calibrate fit` needs --cluster (the cluster the bench or nccl-tests logs ran on)")
    cluster = load_cluster(args.cluster)
    from echo_tune.calibrate.fit.fit_profile import fit_profile, write_residuals  # scipy: loaded by `fit` alone

    outcome = fit_profile(cluster, nccl_logs=args.nccl_tests, bench_dir=args.bench, name=args.name,
                          max_tiers=args.max_tiers, allow_gpu_mismatch=args.allow_gpu_mismatch,
                          allow_cpu_bench=args.allow_cpu_bench)
    save_profile(outcome.profile, args.out)

    # beside a file the profile is written to; a stream or device (-, /dev/stdout, a FIFO) has no "beside"
    residuals = None if stream_target(args.out) is not None else \
        write_residuals(outcome.results, Path(args.out).with_suffix(".residuals.csv"))
    if getattr(args, "json", False):
        print_json({"profile": str(args.out), "residuals": str(residuals) if residuals else None, "warnings": list(outcome.warnings),
                    "fits": [{"quantity": r.quantity, "method": r.method, "points": len(r.points),
                              "rms_relative_error": r.rms_relative_error, "max_relative_error": r.max_relative_error,
                              "coefficients": _params_text(r), "warnings": list(r.warnings)}
                             for r in outcome.results]})
        return 0
    console = _console()
    console.print(fit_table(outcome.results))
    if args.show_points:
        console.print(points_table(outcome.results))
    err = _console(stderr=True)
    for warning in outcome.warnings:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    console.print(f"wrote {args.out}" + (f" (residuals per point: {residuals})" if residuals else
                                         " (no residuals file beside a stream; --show-points prints them)"),
                  highlight=False)
    return 0


def _console(stderr: bool = False) -> Console:
    """Rich console (wide when not writing to a terminal: logs, pipes, tests)."""
    return make_console(stderr=stderr)


def _profile(args: argparse.Namespace, cluster):
    return load_profile(args.profile) if args.profile else profile_for(cluster)


def check_table(result) -> Table:
    table = Table(title=f"{result.collective} on {result.num_gpus} GPUs ({result.num_nodes} node(s)): "
                        f"{Path(result.path).name}")
    for column in ("size (B)", "predicted (us)", "measured (us)", "error"):
        table.add_column(column, justify="right")
    for p in result.points:
        table.add_row(str(p.size_bytes), f"{p.predicted_time_us:.1f}", f"{p.measured_time_us:.1f}",
                      f"{p.relative_error:+.1%}", style="red" if abs(p.relative_error) > 0.2 else None)
    return table


def run_check(args: argparse.Namespace) -> int:
    cluster = load_cluster(args.cluster)
    profile = _profile(args, cluster)
    if args.max_error_pct is not None and not args.max_error_pct >= 0:
        raise ConfigError(f"`--max-error-pct >= 0` must hold, but got (max_error_pct={args.max_error_pct})")
    results = [check_log(cluster, profile, path, allow_gpu_mismatch=args.allow_gpu_mismatch)
               for path in args.nccl_tests]
    if args.json:
        data = [r.to_json() for r in results]
        json.dump(data[0] if len(data) == 1 else data, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console = _console()
        for r in results:
            console.print(check_table(r))
            big = [p for p in r.points if p.size_bytes >= 1 << 20]
            if big:
                console.print(f"max |error| from 1 MiB up: {r.max_abs_error(1 << 20):.1%} over {len(big)} sizes; "
                              f"all sizes: {r.max_abs_error():.1%}", highlight=False)
    for r in results:
        for warning in r.warnings:
            _console(stderr=True).print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    if args.max_error_pct is not None:
        over = [(r, p) for r in results for p in r.points_over(args.max_error_pct / 100)]
        for r, p in over:
            _console(stderr=True).print(f"error: {Path(r.path).name}: {p.size_bytes} B off by {p.relative_error:+.1%}, "
                                        f"more than --max-error-pct {args.max_error_pct:g}", highlight=False)
        return 1 if over else 0
    return 0


def run_predict(args: argparse.Namespace) -> int:
    single = [n for n in args.num_gpus if n < 2]
    if single:  # a collective over one rank moves nothing: its time is 0 and its bus bandwidth undefined
        raise ConfigError(f"`--num-gpus >= 2` must hold for a collective, but got (num_gpus={single[0]}); a group of "
                          f"one GPU communicates nothing")
    cluster = load_cluster(args.cluster)
    profile = _profile(args, cluster)
    sizes = [1 << p for p in range(10, 35, 2)]
    for warning in profile_warnings(profile, cluster):
        _console(stderr=True).print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    rows = {}
    for num_gpus in args.num_gpus:
        place = placement_for(cluster, num_gpus)
        rows[num_gpus] = (place, predict_us(profile, args.collective, place, sizes),
                          extrapolation_warnings(profile, place))
    if args.json:
        json.dump([{"collective": args.collective, "num_gpus": n, "num_nodes": place.num_nodes,
                    "points": [{"size_bytes": s, "predicted_time_us": round(t, 3)} for s, t in zip(sizes, times)]}
                   for n, (place, times, _) in rows.items()], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = Table(title=f"predicted {args.collective} time (us) and bus bandwidth with {profile.name} "
                        f"({profile.label})")
    table.add_column("size (B)", justify="right")
    for n, (place, _, _) in rows.items():
        table.add_column(f"{n} GPUs / {place.num_nodes} node(s)", justify="right")

    for i, size in enumerate(sizes):
        table.add_row(str(size), *[f"{t[i]:.1f} ({bus_factor(args.collective, n) * size / t[i] / 1e3:.3g} GB/s)"
                                   for n, (_, t, _) in rows.items()])
    _console().print(table)
    for _, (_, _, warnings) in rows.items():
        for warning in warnings:
            _console(stderr=True).print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    return 0
