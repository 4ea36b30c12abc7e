"""``echo-tune search SPACE.yaml``: find the fastest Megatron-LM layout in a search space."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from echo_tune.cli.main import exits_after_command
from echo_tune.console import make_console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
import optuna

from echo_tune.cli.common import add_clock_argument, human_time, model_header, print_json
from echo_tune.cli.progress import STOP, PlainProgress
from echo_tune.cost.profile import load_profile, profile_for
from echo_tune.errors import ConfigError
from echo_tune.plan.bands import band_or_none, kind_of
from echo_tune.plan.anchors import anchor, anchor_text
from echo_tune.plan.host_share import record_host_share
from echo_tune.plan.explain import explain
from echo_tune.plan.planner import study_records
from echo_tune.plan.report import explanation_tables
from echo_tune.plan.safety import fit_hint, fit_hint_text, near_tie, near_tie_text
from echo_tune.search.space.auto_space import CAPS_HELP, FP8_CHOICES, auto_space_dict, layout_overrides, write_space
from echo_tune.search.space.dominance import closest_miss as closest_miss_record
from echo_tune.search.space.labels import full_label
from echo_tune.search.outputs.results import trial_record, untimed_record
from echo_tune.search.space.auto_values import AUTO_CAPS
from echo_tune.search.space.search_space import OBJECTIVES, load_space, space_from_dict, with_overrides
from echo_tune.search.engines.sampler import SAMPLERS
from echo_tune.search.engines.auto import AUTO_BUDGET
from echo_tune.search.engines.sampler import DEFAULT_SAMPLER
from echo_tune.search.engines.gc_pause import gc_paused
from echo_tune.search.storage.study_storage import open_storage
from echo_tune.search.study import DEFAULT_N_TRIALS, SearchOptions, run_search
from echo_tune.cli.search_report import print_result
from echo_tune.tables import add_format_arguments, output_format, print_table


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "search", help="search Megatron-LM layouts for the fastest step (Optuna + the simulator)",
        description="Search the layouts of a search-space file for the fastest simulated step. Results go to "
                    "RESULTS_DIR/STUDY_NAME/: trials.csv, best.json, megatron_args.txt, best_trace.json (and "
                    "pareto.csv/.svg for several objectives); the study itself is stored there as journal.log "
                    "(optuna-dashboard opens it). Exit code 1 when no layout fits in memory.")
    parser.add_argument("space", nargs="?", default=None,
                        help="search-space YAML file (see search_spaces/; " + AUTO_CAPS + "); or leave it out and "
                             "give --model, --cluster, --num-gpus and --global-batch-size")
    zero = parser.add_argument_group("search without a space file")
    zero.add_argument("--model", help="model preset, YAML file or Hugging Face config.json")
    zero.add_argument("--cluster", help="cluster preset or YAML file")
    zero.add_argument("--num-gpus", type=int, help="GPUs in the run")
    zero.add_argument("--global-batch-size", type=int, help="sequences per step (Megatron --global-batch-size)")
    zero.add_argument("--seq-length", type=int, help="training sequence length (default: the model's)")
    zero.add_argument("--fp8-format", choices=FP8_CHOICES, default=None,
                      help="FP8 linear GEMMs (Megatron --fp8-format): auto searches BF16 and FP8 hybrid where the "
                           "GPU has FP8 tensor cores, hybrid or e4m3 fixes the format, none (default) trains in BF16")
    zero.add_argument("--layout", action="append", metavar="FIELD=VALUES", default=None,
                      help="search any setting a space file can, replacing the built values: FIELD=auto or a "
                           "comma-separated list, e.g. --layout recompute_method=auto --layout "
                           "recompute_num_layers=1,2,4 (repeat the flag)")
    zero.add_argument("--write-space", metavar="FILE", help="also save the built space as YAML, to edit and reuse. "
                                                            + CAPS_HELP)
    parser.add_argument("--sampler", default=DEFAULT_SAMPLER, choices=sorted(SAMPLERS),
                        help="auto (default: every pipeline/parallel structure at a few layouts, then every layout "
                             "of the best structures), tpe, random, nsga2 (multi-objective) or exhaustive (every "
                             "valid layout)")
    parser.add_argument("--n-trials", type=int, default=None,
                        help=f"trials the study should hold in total (default: auto {AUTO_BUDGET} at most, tpe, "
                             f"random and nsga2 {DEFAULT_N_TRIALS}; exhaustive: every valid layout); a resumed "
                             f"study runs only the missing ones")
    parser.add_argument("--timeout", type=float, default=None, help="stop starting trials after this many seconds")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0; same seed, same study)")
    parser.add_argument("--n-jobs", type=int, default=1,
                        help="processes (default 1); exhaustive spreads batches of layouts over them, the other "
                             "samplers run one sampling process each on the shared study (not reproducible then)")
    parser.add_argument("--objectives", default=None,
                        help=f"comma-separated, overrides the file: {', '.join(OBJECTIVES)} "
                             f"(e.g. step_time,peak_memory)")
    parser.add_argument("--gpu-hour-cost", type=float, default=None, help="price of one GPU-hour (cost objective)")
    parser.add_argument("--currency", default=None, help="currency of the price (default: the space's, else USD)")
    parser.add_argument("--memory-headroom-gib", type=float, default=None,
                        help="GiB a layout must leave free under the HBM size (default: the space's, else 2)")
    parser.add_argument("--study-name", default=None, help="study name (default: the space's name)")
    parser.add_argument("--results-dir", default="results", help="where study folders go (default results/)")
    parser.add_argument("--storage", default=None,
                        help="Optuna storage URL (sqlite:///x.db, postgresql://..., redis://...) or a journal file "
                             "path; default RESULTS_DIR/STUDY_NAME/journal.log")
    parser.add_argument("--resume", action="store_true", help="continue the study if it exists")
    parser.add_argument("--overwrite", action="store_true", help="delete the study if it exists and start over (only the files it wrote; yours in its folder are kept)")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false",
                        help="do not seed the study with the obvious baseline layouts")
    parser.add_argument("--near-tie-pct", type=float, default=3.0,
                        help="name a layout at most this many percent slower than the best that leaves at least "
                             "4 GiB more memory free (default 3)")
    parser.add_argument("--top", type=int, default=10, help="rows in the table of best layouts (default 10)")
    add_format_arguments(parser, "the table of best layouts")
    parser.add_argument("--no-explain", dest="explain", action="store_false",
                        help="skip the explanation: the best layout of each TP x PP x CP family beside the winner's "
                             "breakdown, why it wins, and the ranking with overlap, interference and efficiency "
                             "assumptions off or worse (single-objective searches)")
    add_clock_argument(parser)
    parser.set_defaults(run=run)


def closest_miss(space, result) -> dict | None:
    """The layout that overflows memory the least, when none fits (``dominance.closest_miss``): a stored trial, or
    a recompute variant the memory rule did not simulate (simulated now: ``trial`` None)."""
    store = open_storage(Path(result.results_dir), result.storage)
    study = optuna.load_study(study_name=result.study_name, storage=store.storage)
    over, numbers = [], {}
    for t in study.get_trials(deepcopy=False):
        r = trial_record(t) or untimed_record(t)
        if r is not None and not r["fits_memory"]:
            over.append(r)
            numbers[id(r)] = t.number
    rec = closest_miss_record(space, over)
    if rec is None:
        return None
    return {"trial": numbers.get(id(rec)), "layout": full_label(rec["config"], rec["derived"].get("data_parallel_size")),
            "over_gib": rec["memory_overshoot_bytes"] / 2**30, "config": rec["config"], "record": rec}


def search_records(space, result) -> list[dict]:
    """Every simulated record of a finished search's study (as the search left it, else read back)."""
    if result.records is not None:
        return result.records

    store = open_storage(Path(result.results_dir), result.storage)
    return study_records(space, store.storage, result.study_name)


def explain_search(space, result, records: list[dict] | None = None) -> dict | None:
    """The planner's explanation for a finished single-objective search (its stored trials)."""
    if len(space.objectives) > 1:
        return None

    return explain(space, records if records is not None else search_records(space, result))


def _progress_bar(console: Console, label: str):
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), console=console,
                    transient=False, disable=not console.is_terminal)


def space_of_args(args: argparse.Namespace):
    """The space file, or the space built from --model/--cluster/--num-gpus/--global-batch-size."""
    zero = {k: getattr(args, k) for k in ("model", "cluster", "num_gpus", "global_batch_size")}
    if args.space is not None:
        given = [f"--{k.replace('_', '-')}" for k, v in {**zero, "seq_length": args.seq_length,
                                                        "fp8_format": args.fp8_format, "layout": args.layout,
                                                        "write_space": args.write_space}.items() if v is not None]
        if given:
            raise ConfigError(f"give a space file or {', '.join(given)}, not both; the file names the model, "
                              f"cluster, GPUs and batch itself")
        return load_space(args.space)
    missing = [f"--{k.replace('_', '-')}" for k, v in zero.items() if v is None]
    if missing:
        raise ConfigError(f"without a space file, search needs --model, --cluster, --num-gpus and "
                          f"--global-batch-size, but {', '.join(missing)} is missing")
    for key in ("num_gpus", "global_batch_size"):
        if zero[key] <= 0:
            raise ConfigError(f"`--{key.replace('_', '-')} > 0` must hold, but got ({zero[key]})")
    data = auto_space_dict(args.model, args.cluster, args.num_gpus, args.global_batch_size,
                           seq_length=args.seq_length, fp8_format=args.fp8_format or "none",
                           layout=layout_overrides(args.layout))
    if args.write_space:
        write_space(data, args.write_space)
    return space_from_dict(data, name=data["name"], source=data["name"])


def result_total(total: int | None) -> str:
    return str(total) if total is not None else "an unknown number of"


def run(args: argparse.Namespace) -> int:
    # the search's objects live to the end: the checks after it need no collection over them, and a process
    # that exits next need not scan them at all
    with gc_paused(freeze_after=exits_after_command()):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    fmt = output_format(args)
    space = space_of_args(args)
    objectives = tuple(o.strip() for o in args.objectives.split(",")) if args.objectives else None
    space = with_overrides(space, objectives=objectives, gpu_hour_cost=args.gpu_hour_cost,
                           memory_headroom_gib=args.memory_headroom_gib, gpu_clock_mhz=args.gpu_clock_mhz,
                           currency=args.currency)
    opts = SearchOptions(sampler=args.sampler, n_trials=args.n_trials, timeout=args.timeout, seed=args.seed,
                         n_jobs=args.n_jobs, study_name=args.study_name, results_dir=args.results_dir,
                         storage=args.storage, resume=args.resume, overwrite=args.overwrite,
                         baselines=args.baselines)
    err = make_console(stderr=True)
    best_seen = [None]
    plain = None if err.is_terminal else PlainProgress(f"search {space.name}")
    with _progress_bar(err, args.sampler) as bar:
        # phase 1 (no count yet): enumerating the valid layouts of the listed values and tracing their shapes
        task = bar.add_task(f"enumerating layouts of {space.product_size} combinations", total=None, best="-")
        simulating = [False]

        def progress(done: int, total: int | None, record: dict | None) -> None:
            if not simulating[0]:  # phase 2: simulating, with counts
                simulating[0] = True
                bar.update(task, description=f"{args.sampler} {space.name}: simulating")
            if record is not None and record["fits_memory"] and (best_seen[0] is None
                                                                  or record["step_time_s"] < best_seen[0]):
                best_seen[0] = record["step_time_s"]
            bar.update(task, completed=done, total=total,
                       best=human_time(best_seen[0]) if best_seen[0] is not None else "-")
            if plain is not None:
                if plain.fresh:
                    plain.start(f"{args.sampler} sampler, " + ("every valid layout, counted as it runs" if total is None
                                and args.sampler == "exhaustive" else f"{result_total(total)} trials to run"))
                plain.update(done, total, best_seen[0])
            STOP.check()  # a safe point: SIGTERM stops the search here, like Ctrl-C
        try:
            result = run_search(space, opts, progress=progress)
        finally:
            STOP.deferred = False
    explanation, miss, tie = None, None, None
    if result.best is not None and not result.interrupted and len(space.objectives) == 1:
        records = search_records(space, result)
        tie = near_tie(records, args.near_tie_pct, space)
        explanation = explain_search(space, result, records) if args.explain else None
    if result.best is None and result.n_trials:
        miss = closest_miss(space, result)
        if miss is not None:
            miss["fit_hint"] = fit_hint(space, miss.pop("record"))
    band = None
    if result.best is not None:
        cfg = result.best["config"]

        used = load_profile(space.profile_path) if space.profile_path else profile_for(space.cluster)
        band = band_or_none(used, space.cluster, kind_of(space.model),
                            "fp4" if cfg.get("fp4_format") else bool(cfg.get("fp8_format")), cfg["num_gpus"],
                            host_share=lambda: record_host_share(space, result.best))
        result.best["error_band"] = band
        band = None if band["match"] == "none" else band
        measured = anchor(space.model, space.cluster.gpu.name, cfg["num_gpus"], space.global_batch_size,
                          result.best["step_time_s"])
        if measured is not None:
            result.best["measured_anchor"] = measured
    header = model_header(space.model, args.model if args.space is None else None, args.seq_length)
    if fmt == "json":
        print_json({**result.to_dict(), "model_header": header,
                    **({"explanation": explanation} if explanation else {}),
                    **({"near_tie": tie} if tie else {}),
                    **({"closest_miss": miss} if miss else {})})
    else:
        console = make_console()
        print_result(space, result, top=args.top, console=console, fmt=fmt, header=header)
        if fmt != "csv":
            if band is not None:
                console.print(f"error band (prediction error, predicted - measured, out of sample): {band['text']} "
                              f"({band['note']})", highlight=False, markup=False)
            if result.best is not None and "measured_anchor" in result.best:
                console.print(anchor_text(result.best["measured_anchor"]), highlight=False,
                              markup=False)
            if tie is not None:
                console.print(near_tie_text(tie, args.near_tie_pct), highlight=False, markup=False)
            if miss is not None:
                which = f"trial {miss['trial']}" if miss["trial"] is not None else "simulated after the search"
                console.print(f"closest miss ({which}): {miss['layout']}; "
                              f"{fit_hint_text(miss['fit_hint'], space.cluster.gpu.name)}",
                              highlight=False, markup=False)
            if explanation is not None:
                breakdown, sens = explanation_tables(explanation)
                print_table(breakdown, fmt, console)
                console.print(explanation["why"], highlight=False, markup=False)
                print_table(sens, fmt, console)
    if result.interrupted:
        sys.stderr.write(f"echo-tune search: interrupted; {result.n_trials} finished trial(s) kept in "
                         f"{result.storage}; continue with --resume\n")
        return 130
    return 0 if result.best is not None else 1
