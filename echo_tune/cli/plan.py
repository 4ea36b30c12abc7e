"""``echo-tune plan``: which cluster trains this model on this token budget fastest or cheapest, with which
layout, why, and how sure are we."""

from __future__ import annotations

import argparse
import sys

from echo_tune.cli.checked_args import currency
from echo_tune.cli.common import add_clock_argument, print_json
from echo_tune.cli.progress import STOP
from echo_tune.errors import ConfigError
from echo_tune.plan.explain import explain
from echo_tune.plan.projection import GOODPUT_DEFAULT
from echo_tune.plan.planner import SORT_KEYS, PlanOptions, parse_candidates, plan
from echo_tune.plan.report import print_plan
from echo_tune.plots import available, plot_breakdowns
from echo_tune.search.space.auto_space import CAPS_HELP, FP8_CHOICES, layout_overrides
from echo_tune.tables import add_format_arguments, output_format


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="plan a training run: best layout, time, cost and error band on each candidate cluster",
        description="Search each candidate cluster for its fastest layout (one study each under RESULTS_DIR, "
                    "reused when run again), then print the planner's table (layout, step time, tokens/s, MFU, "
                    "memory headroom, days, GPU-hours, cost, error band) and why the winner wins. " + CAPS_HELP)
    parser.add_argument("--model", required=True, help="model preset, YAML file or Hugging Face config.json")
    parser.add_argument("--tokens", required=True, type=float, help="tokens to train, e.g. 15e12")
    parser.add_argument("--candidate", required=True, action="append", metavar="CLUSTER:GPUS[:PRICE][:PRECISION]",
                        help="a cluster preset or file, its GPU count, optionally the price of one GPU-hour and "
                             "the precision: fp8 (search BF16 and FP8 hybrid), bf16, hybrid or e4m3 (repeat the "
                             "flag for each candidate), e.g. h100:256:2.49:fp8")
    parser.add_argument("--fp8-format", choices=FP8_CHOICES, default="none",
                        help="precision of the candidates that name none: auto searches BF16 and FP8 hybrid where "
                             "the GPU has FP8 tensor cores, hybrid or e4m3 fixes the format, none (default) BF16")
    parser.add_argument("--layout", action="append", metavar="FIELD=VALUES", default=None,
                        help="search any setting a space file can on every candidate, replacing the built values: "
                             "FIELD=auto or a comma-separated list, e.g. --layout recompute_method=auto (repeat)")
    parser.add_argument("--near-tie-pct", type=float, default=3.0,
                        help="name a layout at most this many percent slower than the winner that leaves at least "
                             "4 GiB more memory free (default 3)")
    parser.add_argument("--currency", default="USD", type=currency, help="currency of the prices (default USD)")
    parser.add_argument("--seq-length", type=int, default=None,
                        help="training sequence length (default: the model's; for a config.json the pre-training "
                             "length it states, rope_scaling.original_max_position_embeddings; required otherwise)")
    parser.add_argument("--global-batch-size", type=int, default=None,
                        help="sequences per step (default: the power of two of sequences nearest 4M tokens)")
    parser.add_argument("--deadline-days", type=float, default=None, help="mark candidates that take longer")
    parser.add_argument("--budget", type=float, default=None, help="mark candidates that cost more (in --currency)")
    parser.add_argument("--goodput", type=float, default=GOODPUT_DEFAULT,
                        help=f"share of wall time spent training; days and cost are divided by it (default "
                             f"{GOODPUT_DEFAULT}: Llama 3 405B's >90%% effective training time, arXiv 2407.21783)")
    parser.add_argument("--sort", default="time", choices=SORT_KEYS, help="order of the table (default time)")
    parser.add_argument("--sampler", default="auto", choices=("auto", "tpe", "random", "exhaustive"),
                        help="sampler of each candidate's search (default auto, the search command's default)")
    parser.add_argument("--n-trials", type=int, default=None,
                        help="trials per candidate (default: the sampler's, as in the search command)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    parser.add_argument("--memory-headroom-gib", type=float, default=None,
                        help="GiB a layout must leave free under the HBM size (default 2)")
    parser.add_argument("--results-dir", default="results", help="where the studies go (default results/)")
    parser.add_argument("--no-explain", dest="explain", action="store_false",
                        help="skip the explanation (family breakdowns, why, sensitivity)")
    parser.add_argument("--plot", metavar="FILE.png", default=None,
                        help="also draw the explanation's breakdowns (winner beside each other family's best) "
                             "with matplotlib (pip install -e '.[plot]')")
    add_format_arguments(parser, "csv: the planner's table alone")
    add_clock_argument(parser)
    parser.set_defaults(run=run)


def _progress():
    """Plain lines on stderr (batch logs), every 10% of a candidate's trials."""
    state = {"name": None, "best": None, "step": 0}

    def update(name: str, done: int, total: int | None, record: dict | None) -> None:
        if name != state["name"]:
            state.update(name=name, best=None, step=0)
            sys.stderr.write(f"plan: searching {name} ({total if total is not None else '?'} trials)\n")
        if record is not None and record["fits_memory"] and (state["best"] is None
                                                              or record["step_time_s"] < state["best"]):
            state["best"] = record["step_time_s"]
        if total and (done * 10 // total > state["step"] or done == total):
            state["step"] = done * 10 // total
            best = f"{state['best']:.3f} s" if state["best"] is not None else "none fits yet"
            sys.stderr.write(f"plan: {name}: {done}/{total} trials, best step {best}\n")
        sys.stderr.flush()
        STOP.check()  # SIGTERM stops here, after the trial in hand is stored
    return update


def run(args: argparse.Namespace) -> int:
    if not args.near_tie_pct >= 0:
        raise ConfigError(f"`--near-tie-pct >= 0` must hold, but got ({args.near_tie_pct})")
    candidates, rejected = parse_candidates(args.candidate)  # a bad one is a row with its reason
    opts = PlanOptions(tokens=args.tokens, global_batch_size=args.global_batch_size, currency=args.currency,
                       deadline_days=args.deadline_days, budget=args.budget, n_trials=args.n_trials, seed=args.seed,
                       sampler=args.sampler, results_dir=args.results_dir, sort=args.sort,
                       memory_headroom_gib=args.memory_headroom_gib, seq_length=args.seq_length,
                       goodput=args.goodput, gpu_clock_mhz=args.gpu_clock_mhz,
                       fp8_format=args.fp8_format, near_tie_pct=args.near_tie_pct,
                       layout=layout_overrides(args.layout))
    result = plan(args.model, candidates, opts, progress=_progress(), rejected=rejected)
    explanation = None
    winner = result.winner
    if args.explain and winner is not None:
        explanation = explain(result.spaces[winner["candidate"]], result.records[winner["candidate"]])
    if args.plot:
        if not available():
            raise ConfigError("--plot needs matplotlib; install it with pip install -e '.[plot]' or drop --plot")
        if explanation is not None:
            plot_breakdowns(explanation["families"], args.plot,
                            title=f"{result.model} on {winner['candidate']}: the winner and the best of each other "
                                  f"TP x PP x CP family\n(every layout: {explanation['families'][0]['common']})")
    fmt = output_format(args)
    if fmt == "json":
        print_json({"model": result.model, "tokens": result.tokens, "global_batch_size": result.global_batch_size,
                    "currency": result.currency, "sort": args.sort, "rows": result.rows,
                    "winner": winner["candidate"] if winner else None, "explanation": explanation,
                    "seq_length": result.seq_length, "notes": result.notes})
    else:
        print_plan(result, explanation, sort=args.sort, fmt=fmt)
    return 0 if winner is not None else 1
