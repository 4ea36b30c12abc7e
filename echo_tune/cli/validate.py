"""``echo-tune validate RUNS.csv``: simulated vs measured step time, row by row."""

from __future__ import annotations

import argparse

from rich.table import Table


from echo_tune.console import make_console
from echo_tune.cli.common import add_clock_argument, print_json
from echo_tune.cost.profile import load_profile
from echo_tune.errors import ConfigError
from echo_tune.validate import validate
from echo_tune.validate.compare import summarize


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("validate", help="compare simulated and measured step times of past runs",
                                   description="Simulate each row of a runs CSV (Megatron argument names as "
                                               "columns) and compare with its measured_step_time_s.")
    parser.add_argument("runs", help="CSV of measured runs (format of calibration/published-runs/runs_megatron.csv)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-errata", dest="errata", action="store_false",
                        help="leave out the dataset's errata (settings each row's source states that the CSV "
                             "has no column for; echo_tune/validate/errata/<csv name>.yaml)")
    parser.add_argument("--profile", nargs="+", default=[], metavar="PROFILE.yaml",
                        help="calibration profiles, each used for the rows on its GPU (its `gpu` key), e.g. the "
                             "fitted ones in calibration/published-runs-fit/; rows a profile was fitted on are "
                             "marked in-sample and scored apart")
    add_clock_argument(parser)
    parser.set_defaults(run=run)


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _profiles(paths: list[str]) -> dict:
    profiles = {}
    for path in paths:
        profile = load_profile(path)
        if profile.gpu in profiles:
            raise ConfigError(f"`--profile` takes one profile per GPU, but got two for {profile.gpu!r} ({path})")
        profiles[profile.gpu] = profile
    return profiles


def run(args: argparse.Namespace) -> int:
    profiles = _profiles(args.profile)
    if args.gpu_clock_mhz is not None and not 0 < args.gpu_clock_mhz < 10_000:
        raise ConfigError(f"`0 < --gpu-clock-mhz < 10000` must hold, but got ({args.gpu_clock_mhz})")
    rows, summary, sources = validate(args.runs, errata=args.errata, profiles=profiles,
                                      gpu_clock_mhz=args.gpu_clock_mhz)
    fitted = any(r.in_sample is not None for r in rows)  # a --profile, or the shipped host time (cost/host/host_time.py)
    split = {"in_sample": summarize([r for r in rows if r.in_sample is True]),
             "held_out": summarize([r for r in rows if r.in_sample is False]),
             "no_fitted_profile": summarize([r for r in rows if r.in_sample is None])} if fitted else None
    if args.json:
        print_json({"rows": [{"name": r.name, "source": r.source, "predicted_step_time_s": r.predicted_step_time_s,
                              "measured_step_time_s": r.measured_step_time_s, "error_pct": r.error_pct,
                              "fits_memory": r.fits_memory, "assumed_flags": list(r.assumed_flags),
                              "errata": list(r.errata), "in_sample": r.in_sample,
                              "profile": r.profile_label,
                              "error": r.error} for r in rows],
                    "in_sample_vs_held_out": split,
                    "profiles": {gpu: p.label for gpu, p in profiles.items()},
                    "mape_pct": summary["mape_pct"], "max_abs_error_pct": summary["max_abs_error_pct"],
                    "worst_row": summary["worst_row"], "spearman": summary["spearman"], "by_source": sources})
        return 0
    console = make_console()
    table = Table(title=f"simulated vs measured step time: {args.runs}")
    for col in ("run", "measured s", "predicted s", "error", "fits") + (("fit",) if fitted else ()):
        table.add_column(col, justify="left" if col == "run" else "right")
    for r in rows:
        if r.error:
            verdict = "refused" if r.error.startswith("refused:") else "invalid"
            table.add_row(r.name, f"{r.measured_step_time_s:.3f}", f"[red]{verdict}[/red]", "-", "-",
                          *(("-",) if fitted else ()))
            continue
        table.add_row(r.name, f"{r.measured_step_time_s:.3f}", f"{r.predicted_step_time_s:.3f}",
                      f"{r.error_pct:+.1f}%", "yes" if r.fits_memory else "[red]no[/red]",
                      *(({True: "in-sample", False: "held out", None: "-"}[r.in_sample],) if fitted else ()))
    console.print(table)
    for r in rows:
        if r.error:
            console.print(f"[red]{r.name}: {r.error}[/red]")
    if not summary["n_scored"]:  # every row refused: no error to state
        console.print(f"no row simulated ({summary['n_rows']} rows, each refused above): no error to report")
    else:
        console.print(f"MAPE {_fmt(summary['mape_pct'], '.1f')}%, worst {_fmt(summary['max_abs_error_pct'], '.1f')}% "
                      f"({summary['worst_row']}), Spearman {_fmt(summary['spearman'], '.3f')} over "
                      f"{summary['n_scored']} of {summary['n_rows']} rows")
    used = {r.profile_label for r in rows if r.profile_label}
    for gpu, profile in profiles.items():
        console.print(f"profile for {gpu} rows: {profile.name} ({profile.label})"
                      + ("" if profile.label in used else f" [yellow]unused: no row runs on {gpu}[/yellow]"),
                      highlight=False)
    for label in sorted(used - {p.label for p in profiles.values()}):
        console.print(f"fitted parameters in the default profiles: {label}", highlight=False)
    if split:
        for key, s in split.items():
            if not s["n_scored"]:
                continue
            console.print(f"  {key.replace('_', '-')} rows: MAPE {_fmt(s['mape_pct'], '.1f')}%, worst "
                          f"{_fmt(s['max_abs_error_pct'], '.1f')}% ({s['n_scored']} rows)", highlight=False)
    for source, s in sources.items():
        if not s["n_scored"]:
            console.print(f"  {source}: no row simulated")
            continue
        console.print(f"  {source}: MAPE {_fmt(s['mape_pct'], '.1f')}%, worst {_fmt(s['max_abs_error_pct'], '.1f')}%, "
                      f"Spearman {_fmt(s['spearman'], '.3f')} ({s['n_scored']} rows)")
    assumed = sorted({flag for r in rows for flag in r.assumed_flags})
    if assumed:
        console.print(f"[dim]flags applied from the assumptions column: {' '.join(assumed)}[/dim]")
    by_errata: dict[tuple[str, ...], list[str]] = {}
    for r in rows:
        if r.errata:
            by_errata.setdefault(r.errata, []).append(r.name)
    for errata, names in by_errata.items():
        console.print(f"[dim]errata applied to {', '.join(names)}:[/dim]")
        for line in errata:
            console.print(f"[dim]  {line}[/dim]")
    return 0
