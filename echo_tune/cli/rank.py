"""``echo-tune rank FILE.yaml``: order candidate runs by simulated step time, with time and cost to train."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from echo_tune.cli.common import human_time, print_json
from echo_tune.errors import ConfigError
from echo_tune.search.rank import load_rank_file, parse_tokens, rank

DEFAULT_TOKENS = 1e12


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "rank", help="rank candidate runs (model, cluster, GPUs, layout) by simulated step time",
        description="Simulate every candidate of a rank file and print them fastest first (candidates that do "
                    "not fit in memory last), with throughput, MFU, peak memory and the time and cost to train "
                    "a token budget.")
    parser.add_argument("file", help="rank YAML file (see search_spaces/rank/gpt3-175b-options.yaml)")
    parser.add_argument("--tokens", default=None,
                        help=f"token budget to train, e.g. 1e12 (default: the file's `tokens`, else "
                             f"{DEFAULT_TOKENS:g})")
    parser.add_argument("--json", action="store_true", help="print the ranked list as JSON")
    parser.add_argument("--sort", default="time", choices=("time", "cost"),
                        help="order of the fitting candidates: fastest (default) or cheapest first")
    parser.add_argument("--currency", default="USD", help="currency of the gpu_hour_cost prices (default USD)")
    parser.add_argument("--memory-headroom-gib", type=float, default=2.0,
                        help="GiB a candidate must leave free under the HBM size to count as fitting (default 2)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    candidates, file_tokens = load_rank_file(args.file)
    tokens = parse_tokens(args.tokens) if args.tokens is not None else (file_tokens or DEFAULT_TOKENS)
    if args.memory_headroom_gib < 0:
        raise ConfigError(f"`--memory-headroom-gib >= 0` must hold, but got ({args.memory_headroom_gib})")
    rows = rank(candidates, tokens, args.memory_headroom_gib, sort=args.sort)
    for r in rows:
        if not r.get("refused"):
            r["currency"] = args.currency if r["cost"] is not None else None
    if args.json:
        print_json(rows)
    else:
        print_ranking(rows, tokens, currency=args.currency, sort=args.sort)
    return 0


def _duration(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:,.1f} d" if days >= 1 else f"{seconds / 3600:,.1f} h"


def _si(value: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.3g}{suffix}"
    return f"{value:.3g}"


def print_ranking(rows: list[dict], tokens: float, console: Console | None = None, *, currency: str = "USD",
                  sort: str = "time") -> None:
    console = console or Console()
    models = sorted({r["config"]["model"] for r in rows if not r.get("refused")})
    order = "fastest" if sort == "time" else "cheapest"
    table = Table(title=f"{', '.join(models)}: candidates {order} first; time and cost to train "
                        f"{tokens:.3g} tokens")
    for col in ("#", "name", "GPUs", "step time", "tokens/s", "MFU", "peak mem", "headroom", "fits", "to train",
                "GPU-hours", f"cost ({currency})", "error band"):
        table.add_column(col, justify="left" if col == "name" else "right", no_wrap=col == "name")
    for r in rows:
        if r.get("refused"):
            table.add_row("-", r["name"], "-", "[red]refused[/red]", *["-"] * 9)
            continue
        cfg, fits = r["config"], r["fits_memory"]
        band = r["error_band"]
        table.add_row(str(r["rank"]), r["name"], str(cfg["num_gpus"]), human_time(r["step_time_s"]),
                      _si(r["tokens_per_s"]), f"{100 * r['mfu']:.0f}%", f"{r['peak_memory_bytes'] / 2**30:.0f} GiB",
                      f"{r['headroom_gib']:.1f} GiB", "[green]yes[/green]" if fits else "[red]no[/red]",
                      _duration(r["time_to_train_s"]) if fits else "-", _si(r["gpu_hours"]) if fits else "-",
                      _si(r["cost"]) if r["cost"] is not None else "-",
                      band["text"] + ("" if band["match"] == "exact" else f" ({band['match']})"))
    console.print(table)
    console.print(f"[dim]cost = GPU-hours x gpu_hour_cost in {currency} ('-' where no price is given or the "
                  f"layout does not fit); error band: measured step time of the nearest validated family's runs "
                  f"against predicted, lowest..highest[/dim]")
    for r in rows:
        if r.get("refused"):
            console.print(f"[red]{r['name']}: refused: {r['refused']}[/red]")
        elif not r["fits_memory"]:
            console.print(f"[dim]{r['name']}: {r['memory_verdict']}; no time or cost[/dim]")
