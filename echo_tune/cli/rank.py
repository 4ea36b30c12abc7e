"""``echo-tune rank FILE.yaml``: order candidate runs by simulated step time, with time and cost to train."""

from __future__ import annotations

import argparse
import dataclasses

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from echo_tune.cli.checked_args import currency
from echo_tune.cli.common import add_clock_argument, human_time, print_json, with_clock
from echo_tune.console import make_console
from echo_tune.errors import ConfigError
from echo_tune.plan.anchors import anchor_text, faster_than_measured
from echo_tune.plan.bands import band_note
from echo_tune.plan.host_share import host_bound_line
from echo_tune.plan.projection import GOODPUT_DEFAULT, deadline_note, legend
from echo_tune.plan.rank import load_rank_file, parse_tokens, rank
from echo_tune.plan.safety import promote_over_limit_rows
from echo_tune.tables import Column, TextTable, add_format_arguments, note_printer, output_format, print_table

DEFAULT_TOKENS = 1e12


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "rank", help="rank candidate runs (model, cluster, GPUs, layout) by simulated step time",
        description="Simulate every candidate of a rank file and print them fastest first (candidates that do "
                    "not fit in memory last; one over its limit by less than the memory model's measured "
                    "over-prediction is at risk, with its time), with throughput, MFU, peak memory and the time and "
                    "cost to train a token budget.")
    parser.add_argument("file", help="rank YAML file (see search_spaces/rank/gpt3-175b-options.yaml)")
    parser.add_argument("--tokens", default=None,
                        help=f"token budget to train, e.g. 1e12 (default: the file's `tokens`, else "
                             f"{DEFAULT_TOKENS:g})")
    add_format_arguments(parser, "the ranking table")
    parser.add_argument("--sort", default="time", choices=("time", "cost"),
                        help="order of the fitting candidates: fastest (default) or cheapest first")
    parser.add_argument("--currency", default="USD", type=currency,
                        help="currency of the gpu_hour_cost prices (default USD)")
    parser.add_argument("--goodput", type=float, default=GOODPUT_DEFAULT,
                        help=f"share of wall time spent training; days and cost are divided by it (default "
                             f"{GOODPUT_DEFAULT}: Llama 3 405B's >90%% effective training time, arXiv 2407.21783)")
    parser.add_argument("--deadline-days", type=float, default=None,
                        help="mark candidates that miss it, or are at risk of missing it within the error band")
    parser.add_argument("--memory-headroom-gib", type=float, default=2.0,
                        help="GiB a candidate must leave free under the HBM size to count as fitting (default 2)")
    add_clock_argument(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    fmt = output_format(args)
    candidates, file_tokens = load_rank_file(args.file)
    tokens = parse_tokens(args.tokens) if args.tokens is not None else (file_tokens or DEFAULT_TOKENS)
    if args.memory_headroom_gib < 0:
        raise ConfigError(f"`--memory-headroom-gib >= 0` must hold, but got ({args.memory_headroom_gib})")
    for c in candidates:
        if not c.refused:
            c.cluster.gpu.check_headroom(args.memory_headroom_gib)
    if args.deadline_days is not None and not args.deadline_days > 0:
        raise ConfigError(f"`--deadline-days > 0` must hold, but got ({args.deadline_days})")
    if args.gpu_clock_mhz is not None:  # every candidate's cluster at this sustained clock
        candidates = [c if c.refused else dataclasses.replace(c, cluster=with_clock(c.cluster, args))
                      for c in candidates]
    rows = rank(candidates, tokens, args.memory_headroom_gib, sort=args.sort, goodput=args.goodput,
                deadline_days=args.deadline_days)
    # over the limit by less than the memory model's over-prediction: at risk, with its time and cost
    rows = promote_over_limit_rows(rows, tokens, sort=args.sort, goodput=args.goodput,
                                   deadline_days=args.deadline_days)
    for r in rows:
        if not r.get("refused"):
            r["currency"] = args.currency if r["cost"] is not None else None
    if fmt == "json":
        print_json(rows)
    else:
        print_ranking(rows, tokens, currency=args.currency, sort=args.sort, fmt=fmt)
    return 0


def _duration(seconds: float) -> str:
    days = seconds / 86400
    return f"{days:,.1f} d" if days >= 1 else f"{seconds / 3600:,.1f} h"


def _days(days: float) -> str:
    return _duration(days * 86400)


def _with_band(value: float, band, fmt) -> str:
    """"12.3 d (11.0 d-14.1 d)": the expected value, then the error band's range."""
    return fmt(value) + ("" if band is None else f" ({fmt(band[0])}-{fmt(band[1])})")


def _si(value: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= div:
            return f"{value / div:.3g}{suffix}"
    return f"{value:.3g}"


def ranking_table(rows: list[dict], tokens: float, *, currency: str = "USD", sort: str = "time") -> TextTable:
    models = sorted({f"{r['config']['model']} (seq_length {r['config']['model_spec']['seq_length']:,})"
                     for r in rows if not r.get("refused")})
    order = "fastest" if sort == "time" else "cheapest"
    fp8 = any(r["config"].get("fp8_format") for r in rows if not r.get("refused"))
    cols = [("#", 0, False), ("name", 0, True), ("GPUs", 2, False), ("step time", 2, False), ("tokens/s", 1, False),
            ("MFU of BF16 peak" if fp8 else "MFU", 3, False), ("peak mem", 3, False), ("free HBM", 2, False), ("fits", 0, False),
            ("to train", 0, False), ("GPU-hours", 0, False), (f"cost ({currency})", 0, False),
            ("error band", 4, True)]
    table = TextTable(title=f"{', '.join(models)}: candidates {order} first; time and cost to train {tokens:.3g} "
                            f"tokens", columns=[Column(header=h, priority=p, wrap=w, justify="left" if h == "name"
                                                       else "right") for h, p, w in cols])
    names = []
    for r in rows:
        names.append(f"#{r.get('rank', '-')} {r['name']}")
        if r.get("refused"):
            table.add_row("-", escape(r["name"]), "-", "[red]refused[/red]", *["-"] * 9)
            continue
        cfg, fits = r["config"], r.get("feasible", r["fits_memory"])  # feasible: fits, or at risk just over
        band = r["error_band"]
        table.add_row(str(r["rank"]), escape(r["name"]), str(cfg["num_gpus"]), human_time(r["step_time_s"]),
                      # no throughput, MFU or cost for a layout that does not fit (as simulate): it cannot run
                      _si(r["tokens_per_s"]) if fits else "-", f"{100 * r['mfu']:.0f}%" if fits else "-",
                      f"{r['peak_memory_bytes'] / 2**30:.0f} GiB",
                      f"{r['headroom_gib']:.1f} GiB", ("[yellow]at risk[/yellow]" if r.get("memory_band") == "at risk" else
                       "[green]yes[/green]") if fits else "[red]no[/red]",
                      _with_band(r["time_to_train_days"], r.get("days_band"), _days) if fits else "-",
                      _si(r["gpu_hours"]) if fits else "-",
                      _with_band(r["cost"], r.get("cost_band"), _si) if r["cost"] is not None and fits else "-",
                      band["text"] + ("" if band["match"] in ("exact", "none") else f" ({band['match']})"))
    table.row_names = names
    return table


def print_ranking(rows: list[dict], tokens: float, console: Console | None = None, *, currency: str = "USD",
                  sort: str = "time", fmt: str = "table") -> None:
    console = console or make_console()
    print_table(ranking_table(rows, tokens, currency=currency, sort=sort), fmt, console)
    if fmt == "csv":
        return
    line, style = note_printer(console, fmt)

    line(Text(f"cost = GPU-hours x gpu_hour_cost in {currency} ('-' where no price is given or the layout "
              f"does not fit); {legend([r for r in rows if not r.get('refused')])}", style=style("dim")))
    for r in rows:
        note = None if r.get("refused") else (deadline_note(r) or
                                              (band_note(r["error_band"]) if r["error_band"]["match"] == "none" else None))
        if note:
            line(Text(f"{r['name']}: {note}", style=style("yellow")))
        host = None if r.get("refused") else host_bound_line(r.get("host_share"))
        if host:
            line(Text(f"{r['name']}: {host}", style=style("yellow")))
        measured = None if r.get("refused") else r.get("measured_anchor")
        if faster_than_measured(measured):
            line(Text(f"{r['name']}: {anchor_text(measured)}", style=style("yellow")))
    for note in dict.fromkeys(r["clock_note"] for r in rows if r.get("clock_note")):  # once per GPU
        line(Text(note, style=style("yellow")))
    for r in rows:
        if r.get("refused"):
            line(Text(f"{r['name']}: refused: {r['refused']}", style=style("red")))
        elif r.get("over_limit_at_risk"):
            line(Text(f"{r['name']}: {r['memory_verdict']}; its time and cost hold if it fits", style=style("yellow")))
        elif not r.get("feasible", r["fits_memory"]):
            line(Text(f"{r['name']}: {r['memory_verdict']}; no time or cost", style=style("dim")))
