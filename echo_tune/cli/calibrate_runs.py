"""``echo-tune calibrate fit --runs RUNS.csv | --megatron-log LOG...``: fit a profile to measured training runs."""

from __future__ import annotations

import argparse
import shlex
import statistics
from pathlib import Path
import dataclasses

from rich.table import Table

from echo_tune.calibrate.logs.megatron_log import read_logs
from echo_tune.cli.common import print_json
from echo_tune.console import make_console
from echo_tune.cost.profile import load_cluster_profile, save_profile
from echo_tune.errors import ConfigError
from echo_tune.validate.runs import read_runs
from echo_tune.validate.datasets import is_published

HEADER = ("# Fitted by echo-tune calibrate fit on measured training runs (echo_tune/calibrate/fit/fit_runs.py).\n"
          "# Rerun with:\n#   {command}\n# {label}\n")


def add_run_arguments(fit: argparse.ArgumentParser) -> None:
    group = fit.add_argument_group("calibrate from training runs (instead of --bench / --nccl-tests)")
    group.add_argument("--runs", nargs="+", default=[], metavar="CSV",
                       help="runs CSVs in the `validate` format (measured_step_time_s per row)")
    group.add_argument("--megatron-log", nargs="+", default=[], metavar="LOG",
                       help="Megatron-LM training logs (rank 0's whole argument dump and its 'elapsed time per "
                            "iteration (ms)' lines; torchrun [default0]: and srun labels are read; each dump in a "
                            "file is one run, the same run given twice counts once); their cluster is --cluster")
    group.add_argument("--gpu", help="fit the rows on this GPU preset only (runs CSVs may mix GPU types); several, "
                                     "comma-separated (h100-sxm,b200), for --params host alone: GPUs on the same "
                                     "kind of host")
    group.add_argument("--params", default="clock,comm,launch",
                       help="parameters to fit, 1-3 of clock (sustained SM clock of compute-bound kernels), comm "
                            "(factor on collective times), launch (time added to every kernel), host (host time to "
                            "issue one kernel: the GPU waits where kernels run shorter); default clock,comm,launch")
    group.add_argument("--robust-scale", type=float, default=0.10, metavar="R",
                       help="soft-L1 scale of the relative residuals (rows off by much more than R count "
                            "linearly); 0 = plain least squares (default 0.10)")
    group.add_argument("--no-errata", dest="errata", action="store_false",
                       help="leave out the runs CSVs' errata files (as `validate --no-errata`)")


def wants_runs(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "runs", None) or getattr(args, "megatron_log", None))


def _cases(args: argparse.Namespace):
    if args.nccl_tests or args.bench:
        raise ConfigError("give either training runs (--runs / --megatron-log) or microbenchmarks (--bench / "
                          "--nccl-tests) to `calibrate fit`, not both")
    cases = [c for path in args.runs for c in read_runs(path, args.errata)]
    notes: list[str] = []
    if args.megatron_log:
        if not args.cluster:
            raise ConfigError("--megatron-log needs --cluster (the cluster the logged runs ran on: a preset or YAML)")
        cases += read_logs(args.megatron_log, args.cluster, notes)  # each run of each log; the same run once
    skipped = [(c.name, c.error) for c in cases if c.error]
    cases = [c for c in cases if not c.error]
    gpus = sorted({c.cluster.gpu.name for c in cases})
    if args.gpu:
        wanted = [g.strip() for g in args.gpu.split(",") if g.strip()]
        absent = [g for g in wanted if g not in gpus]
        if absent:
            raise ConfigError(f"no row runs on GPU {', '.join(map(repr, absent))}; the rows' GPUs are {gpus}")
        cases = [c for c in cases if c.cluster.gpu.name in wanted]
    elif len(gpus) > 1:
        raise ConfigError(f"a profile is fitted for one GPU type, but the rows run on {gpus}; pick one with --gpu "
                          f"(several, comma-separated, for --params host alone)")
    if not cases:
        first = f"; the first: {skipped[0][0]}: {skipped[0][1]}" if skipped else ""
        raise ConfigError(f"no row to fit: every row was refused or invalid{first}")
    return cases, skipped, notes


def _command(args: argparse.Namespace) -> str:
    """The command line that reruns this fit."""
    parts = ["echo-tune", "calibrate", "fit"]
    if args.runs:
        parts += ["--runs", *args.runs]
    if args.megatron_log:
        parts += ["--megatron-log", *args.megatron_log]
    for flag, value, default in (("--cluster", args.cluster, None), ("--gpu", args.gpu, None),
                                 ("--params", args.params, "clock,comm,launch"), ("--robust-scale", args.robust_scale, 0.10),
                                 ("--name", args.name, None)):
        if value is not None and value != default:
            parts += [flag, str(value)]
    if not args.errata:
        parts.append("--no-errata")
    return " ".join(shlex.quote(str(p)) for p in [*parts, "--out", args.out])


def run_fit_runs(args: argparse.Namespace) -> int:
    # lazy: loads numpy (~0.2 s), which importing cli.calibrate_runs does not
    from echo_tune.calibrate.fit.fit_runs import fit_runs, sha256

    if Path(args.out).is_symlink():  # never write through a link into another file (issue 20)
        raise ConfigError(f"--out {args.out!r} is a symbolic link; give a plain file path (the profile is not "
                          f"written through links)")
    cases, skipped, notes = _cases(args)
    cluster = cases[0].cluster
    base = load_cluster_profile(cluster)
    bases = {cluster.gpu.name: base}
    for case in cases:  # each GPU type's rows run with its own profile (several only for a host-time fit)
        if case.cluster.gpu.name not in bases:
            bases[case.cluster.gpu.name] = load_cluster_profile(case.cluster)
    inputs = [{"path": str(p), "sha256": sha256(p)} for p in dict.fromkeys((*args.runs, *args.megatron_log))]
    published = bool(args.runs) and not args.megatron_log and all(is_published(p) for p in args.runs)
    command = _command(args)
    params = tuple(p.strip() for p in args.params.split(",") if p.strip())
    if not 0 <= args.robust_scale <= 10:
        raise ConfigError(f"`0 <= --robust-scale <= 10` must hold, but got ({args.robust_scale})")
    result = fit_runs(cases, base, cluster.gpu, params=params, robust_scale=args.robust_scale, inputs=inputs,
                      command=command, published=published, bases=bases)
    profile = result.profile
    if args.name:
        profile = dataclasses.replace(profile, name=args.name)
    save_profile(profile, args.out, header=HEADER.format(command=command, label=profile.fitted["label"]))
    _report(args, result, skipped, notes, {c.name: c.defaults for c in cases if getattr(c, "defaults", ())})
    return 0


def unfitted_sources(rows: list[dict], n_params: int) -> dict[str, int]:
    """The sources whose leave-one-source-out error is the unfitted profile's, each with the rows of other sources
    left when it is held out: fewer than parameters + 2, too few to refit (``calibrate/fit/fit_runs.py``)."""
    keys = [r["source_key"] for r in rows]
    return {k: len(keys) - keys.count(k) for k in dict.fromkeys(keys) if len(keys) - keys.count(k) < n_params + 2}


def loso_note(rows: list[dict], n_params: int, unfitted_mape_pct: float) -> str | None:
    """Why leave-one-source-out equals the unfitted prediction, where it does; None where every source is refitted."""
    plain = unfitted_sources(rows, n_params)
    if not plain:
        return None
    need = n_params + 2
    if len(plain) == len({r["source_key"] for r in rows}):
        if len(plain) == 1:
            (key,) = plain
            why = (f"all rows come from one source ({key!r}: the dataset or paper of the `source` column), and "
                   f"holding it out leaves no row to fit")
        else:
            why = (f"holding out any one source leaves at most {max(plain.values())} rows of the others, fewer than "
                   f"the {need} a fit of {n_params} parameter(s) needs")
        return (f"leave-one-source-out not shown: {why}, so it would be the unfitted prediction (MAPE "
                f"{unfitted_mape_pct:.1f}%); give runs of two or more sources to measure it")
    return (f"leave-source-out marked '*' is the unfitted prediction: holding out {', '.join(sorted(plain))} leaves "
            f"fewer than the {need} rows a fit of {n_params} parameter(s) needs")


def _report(args, result, skipped, notes=(), defaults: dict | None = None) -> None:
    errors = result.profile.fitted["errors"]
    n_params = len(result.params)
    plain = unfitted_sources(result.rows, n_params)
    note = loso_note(result.rows, n_params, errors["unfitted_mape_pct"])
    hide = bool(plain) and len(plain) == len({r["source_key"] for r in result.rows})
    if args.json:
        print_json({"profile": str(args.out), "params": result.params, "label": result.profile.fitted["label"],
                    "errors": errors, "rows": result.rows,
                    "loso_unfitted_sources": sorted(plain), "loso_note": note,
                    "assumed_defaults": {k: list(v) for k, v in (defaults or {}).items()},
                    "warnings": [*notes, *result.warnings],
                    "skipped": [{"name": n, "error": e} for n, e in skipped]})
        return

    gpus = args.gpu if args.gpu and "," in args.gpu else result.profile.gpu  # a host fit over several GPUs names them
    table = Table(title=f"fit on {len(result.rows)} runs ({gpus})")
    columns = ("run", "source", "measured s", "predicted s", "error", "leave-one-out") + (() if hide else
                                                                                         ("leave-source-out",))
    for col in columns:
        table.add_column(col, justify="left" if col in ("run", "source") else "right")
    for r in result.rows:
        loso = () if hide else (f"{r['loso_error_pct']:+.1f}%" + ("*" if r["source_key"] in plain else ""),)
        table.add_row(r["name"], r["source_key"], f"{r['measured_step_time_s']:.3f}", f"{r['predicted_step_time_s']:.3f}",
                      f"{r['error_pct']:+.1f}%", f"{r['loo_error_pct']:+.1f}%", *loso)
    console = make_console()
    console.print(table)
    console.print("fitted: " + ", ".join(f"{k}={v:.4g}" for k, v in result.params.items()), highlight=False)
    loso = "" if hide else f", leave-one-source-out {errors['loso_mape_pct']:.1f}%" + ("*" if plain else "")
    console.print(f"MAPE in-sample {errors['in_sample_mape_pct']:.1f}% (unfitted {errors['unfitted_mape_pct']:.1f}%), "
                  f"leave-one-out {errors['loo_mape_pct']:.1f}%{loso}; "
                  f"median signed error {statistics.median(r['error_pct'] for r in result.rows):+.1f}%", highlight=False)
    if not hide:
        for key, value in errors["loso_by_source_mape_pct"].items():
            console.print(f"  held out {key}: MAPE {value:.1f}%" + (" (unfitted)" if key in plain else ""),
                          highlight=False)
    if note:
        console.print(note, highlight=False, soft_wrap=True)
    err = make_console(stderr=True)
    for name, error in skipped:
        err.print(f"[dim]skipped {name}: {error}[/dim]", highlight=False, soft_wrap=True)
    for warning in [*notes, *result.warnings, *_defaults_warnings(result.rows, defaults or {})]:
        err.print(f"[yellow]warning:[/yellow] {warning}", highlight=False, soft_wrap=True)
    console.print(f"wrote {args.out} ({result.profile.fitted['label']})", highlight=False)


def _defaults_warnings(rows: list[dict], defaults: dict[str, tuple[str, ...]]) -> list[str]:
    """One warning per set of Megatron defaults the fitted rows rely on (rows without a `model` that leave the
    architecture fields out: validate/run_models.py)."""
    fitted = {r["name"] for r in rows}
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, assumed in defaults.items():
        if assumed and name in fitted:
            groups.setdefault(assumed, []).append(name)
    out = []
    for assumed, names in groups.items():
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out.append(f"{shown} state no model and take Megatron's GPT-3 defaults for {'; '.join(assumed)}; right for "
                   f"GPT-3-like models only: add a `model` column (a preset, a model YAML or a config.json) or those "
                   f"columns")
    return out
