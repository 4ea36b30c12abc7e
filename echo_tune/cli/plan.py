"""``echo-tune plan``: which cluster trains this model on this token budget fastest or cheapest, with which
layout, why, and how sure are we."""

from __future__ import annotations

import argparse
import sys

from echo_tune.cli.common import print_json
from echo_tune.cli.progress import STOP
from echo_tune.errors import ConfigError
from echo_tune.plan.planner import SORT_KEYS, PlanOptions, parse_candidate, plan
from echo_tune.search.auto_space import CAPS_HELP


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "plan", help="plan a training run: best layout, time, cost and error band on each candidate cluster",
        description="Search each candidate cluster for its fastest layout (one study each under RESULTS_DIR, "
                    "reused when run again), then print the planner's table (layout, step time, tokens/s, MFU, "
                    "memory headroom, days, GPU-hours, cost, error band) and why the winner wins. " + CAPS_HELP)
    parser.add_argument("--model", required=True, help="model preset, YAML file or Hugging Face config.json")
    parser.add_argument("--tokens", required=True, type=float, help="tokens to train, e.g. 15e12")
    parser.add_argument("--candidate", required=True, action="append", metavar="CLUSTER:GPUS[:PRICE]",
                        help="a cluster preset or file, its GPU count and optionally the price of one GPU-hour "
                             "(repeat the flag for each candidate), e.g. h100:256:2.49")
    parser.add_argument("--currency", default="USD", help="currency of the prices (default USD)")
    parser.add_argument("--seq-length", type=int, default=None,
                        help="training sequence length (default: the model's; for a config.json its pre-training "
                             "length, rope_scaling.original_max_position_embeddings, else max_position_embeddings)")
    parser.add_argument("--global-batch-size", type=int, default=None,
                        help="sequences per step (default: about 4M tokens, 2^22 / seq_length)")
    parser.add_argument("--deadline-days", type=float, default=None, help="mark candidates that take longer")
    parser.add_argument("--budget", type=float, default=None, help="mark candidates that cost more (in --currency)")
    parser.add_argument("--sort", default="time", choices=SORT_KEYS, help="order of the table (default time)")
    parser.add_argument("--sampler", default="tpe", choices=("tpe", "random", "exhaustive"),
                        help="sampler of each candidate's search (default tpe)")
    parser.add_argument("--n-trials", type=int, default=120, help="trials per candidate (default 120)")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0)")
    parser.add_argument("--memory-headroom-gib", type=float, default=None,
                        help="GiB a layout must leave free under the HBM size (default 2)")
    parser.add_argument("--results-dir", default="results", help="where the studies go (default results/)")
    parser.add_argument("--no-explain", dest="explain", action="store_false",
                        help="skip the explanation (family breakdowns, why, sensitivity)")
    parser.add_argument("--plot", metavar="FILE.png", default=None,
                        help="also draw the explanation's breakdowns (winner beside each other family's best) "
                             "with matplotlib (pip install -e '.[plot]')")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
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
    candidates = [parse_candidate(c) for c in args.candidate]
    opts = PlanOptions(tokens=args.tokens, global_batch_size=args.global_batch_size, currency=args.currency,
                       deadline_days=args.deadline_days, budget=args.budget, n_trials=args.n_trials, seed=args.seed,
                       sampler=args.sampler, results_dir=args.results_dir, sort=args.sort,
                       memory_headroom_gib=args.memory_headroom_gib, seq_length=args.seq_length)
    result = plan(args.model, candidates, opts, progress=_progress())
    explanation = None
    winner = result.winner
    if args.explain and winner is not None:
        from echo_tune.plan.explain import explain

        explanation = explain(result.spaces[winner["candidate"]], result.records[winner["candidate"]])
    if args.plot:
        from echo_tune.plots import available, plot_breakdowns

        if not available():
            raise ConfigError("--plot needs matplotlib; install it with pip install -e '.[plot]' or drop --plot")
        if explanation is not None:
            plot_breakdowns(explanation["families"], args.plot,
                            title=f"{result.model} on {winner['candidate']}: the winner and the best of each other "
                                  f"TP x PP x CP family\n(every layout: {explanation['families'][0]['common']})")
    if args.json:
        print_json({"model": result.model, "tokens": result.tokens, "global_batch_size": result.global_batch_size,
                    "currency": result.currency, "sort": args.sort, "rows": result.rows,
                    "winner": winner["candidate"] if winner else None, "explanation": explanation,
                    "notes": result.notes})
    else:
        from echo_tune.plan.report import print_plan

        print_plan(result, explanation, sort=args.sort)
    return 0 if winner is not None else 1
