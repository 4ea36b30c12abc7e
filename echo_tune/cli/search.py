"""``echo-tune search SPACE.yaml``: find the fastest Megatron-LM layout in a search space."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from echo_tune.console import make_console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from echo_tune.cli.common import human_bytes, human_time, print_json
from echo_tune.cli.progress import STOP, PlainProgress
from echo_tune.plan.labels import short_labels
from echo_tune.errors import ConfigError
from echo_tune.search.auto_space import CAPS_HELP, auto_space_dict, write_space
from echo_tune.search.space import AUTO_CAPS, OBJECTIVES, load_space, space_from_dict, with_overrides
from echo_tune.search.sampler import SAMPLERS
from echo_tune.search.study import DEFAULT_N_TRIALS, SearchOptions, SearchResult, run_search


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
    zero.add_argument("--write-space", metavar="FILE", help="also save the built space as YAML, to edit and reuse. "
                                                            + CAPS_HELP)
    parser.add_argument("--sampler", default="tpe", choices=sorted(SAMPLERS),
                        help="tpe (default), random, nsga2 (multi-objective) or exhaustive (every valid layout)")
    parser.add_argument("--n-trials", type=int, default=None,
                        help=f"trials the study should hold in total (default {DEFAULT_N_TRIALS}; exhaustive: "
                             f"every valid layout); a resumed study runs only the missing ones")
    parser.add_argument("--timeout", type=float, default=None, help="stop starting trials after this many seconds")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed (default 0; same seed, same study)")
    parser.add_argument("--n-jobs", type=int, default=1,
                        help="processes (default 1); exhaustive spreads batches of layouts over them, the other "
                             "samplers run one sampling process each on the shared study (not reproducible then)")
    parser.add_argument("--objectives", default=None,
                        help=f"comma-separated, overrides the file: {', '.join(OBJECTIVES)} "
                             f"(e.g. step_time,peak_memory)")
    parser.add_argument("--gpu-hour-cost", type=float, default=None, help="price of one GPU-hour (cost objective)")
    parser.add_argument("--memory-headroom-gib", type=float, default=None,
                        help="GiB a layout must leave free under the HBM size (default: the space's, else 2)")
    parser.add_argument("--study-name", default=None, help="study name (default: the space's name)")
    parser.add_argument("--results-dir", default="results", help="where study folders go (default results/)")
    parser.add_argument("--storage", default=None,
                        help="Optuna storage URL (sqlite:///x.db, postgresql://..., redis://...) or a journal file "
                             "path; default RESULTS_DIR/STUDY_NAME/journal.log")
    parser.add_argument("--resume", action="store_true", help="continue the study if it exists")
    parser.add_argument("--overwrite", action="store_true", help="delete the study if it exists and start over")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false",
                        help="do not seed the study with the obvious baseline layouts")
    parser.add_argument("--top", type=int, default=10, help="rows in the table of best layouts (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--no-explain", dest="explain", action="store_false",
                        help="skip the explanation: the best layout of each TP x PP x CP family beside the winner's "
                             "breakdown, why it wins, and the ranking with overlap, interference and efficiency "
                             "assumptions off or worse (single-objective searches)")
    parser.set_defaults(run=run)


def closest_miss(result) -> dict | None:
    """The simulated layout that overflows memory the least, when none fits."""
    import optuna

    from echo_tune.plan.labels import full_label
    from echo_tune.search.results import trial_record
    from echo_tune.search.storage import open_storage

    store = open_storage(Path(result.results_dir), result.storage)
    study = optuna.load_study(study_name=result.study_name, storage=store.storage)
    over = [(t.number, r) for t in study.get_trials(deepcopy=False) if (r := trial_record(t)) is not None
            and not r["fits_memory"]]
    if not over:
        return None
    number, rec = min(over, key=lambda nr: nr[1]["memory_overshoot_bytes"])
    return {"trial": number, "layout": full_label(rec["config"], rec["derived"].get("data_parallel_size")),
            "over_gib": rec["memory_overshoot_bytes"] / 2**30, "config": rec["config"]}


def explain_search(space, result) -> dict | None:
    """The planner's explanation for a finished single-objective search (its stored trials)."""
    if len(space.objectives) > 1:
        return None
    from echo_tune.plan.explain import explain
    from echo_tune.plan.planner import study_records
    from echo_tune.search.storage import open_storage

    store = open_storage(Path(result.results_dir), result.storage)
    return explain(space, study_records(space, store.storage, result.study_name))


def _progress_bar(console: Console, label: str):
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), console=console,
                    transient=False, disable=not console.is_terminal)


def space_of_args(args: argparse.Namespace):
    """The space file, or the space built from --model/--cluster/--num-gpus/--global-batch-size."""
    zero = {k: getattr(args, k) for k in ("model", "cluster", "num_gpus", "global_batch_size")}
    if args.space is not None:
        given = [f"--{k.replace('_', '-')}" for k, v in {**zero, "seq_length": args.seq_length,
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
                           seq_length=args.seq_length)
    if args.write_space:
        write_space(data, args.write_space)
    return space_from_dict(data, name=data["name"], source=data["name"])


def result_total(total: int | None) -> str:
    return str(total) if total is not None else "an unknown number of"


def run(args: argparse.Namespace) -> int:
    space = space_of_args(args)
    objectives = tuple(o.strip() for o in args.objectives.split(",")) if args.objectives else None
    space = with_overrides(space, objectives=objectives, gpu_hour_cost=args.gpu_hour_cost,
                           memory_headroom_gib=args.memory_headroom_gib)
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
                    plain.start(f"{args.sampler} sampler, {result_total(total)} trials to run")
                plain.update(done, total, best_seen[0])
            STOP.check()  # a safe point: SIGTERM stops the search here, like Ctrl-C
        try:
            result = run_search(space, opts, progress=progress)
        finally:
            STOP.deferred = False
    explanation, miss = None, None
    if args.explain and result.best is not None and not result.interrupted:
        explanation = explain_search(space, result)
    if result.best is None and result.n_trials:
        miss = closest_miss(result)
    band = None
    if result.best is not None:
        from echo_tune.plan.bands import band_for, band_summary

        cfg = result.best["config"]
        band = band_for(space.cluster.gpu.name, space.model.is_moe, bool(cfg.get("fp8_format")), cfg["num_gpus"])
        band = band_summary(band)
        result.best["error_band"] = band
    if args.json:
        print_json({**result.to_dict(), **({"explanation": explanation} if explanation else {}),
                    **({"closest_miss": miss} if miss else {})})
    else:
        print_result(space, result, top=args.top)
        if band is not None:
            make_console().print(f"error band: measured {band['text']} against predicted ({band['note']}, "
                            f"{band['n_runs']} validated runs)", highlight=False)
        if miss is not None:
            make_console().print(f"closest miss: {miss['layout']} needs {miss['over_gib']:.1f} GiB more than the limit "
                            f"(trial {miss['trial']})", highlight=False)
        if explanation is not None:
            from echo_tune.plan.report import explanation_tables

            console = make_console()
            for table in explanation_tables(explanation):
                console.print(table)
            console.print(explanation["why"], highlight=False)
    if result.interrupted:
        sys.stderr.write(f"echo-tune search: interrupted; {result.n_trials} finished trial(s) kept in "
                         f"{result.storage}; continue with --resume\n")
        return 130
    return 0 if result.best is not None else 1


def layout_label(cfg: dict, dp: int | None = None) -> str:
    """A compact layout string: TP4 PP8 DP32 VPP6 mbs2 selective SP DistOpt."""
    parts = [f"TP{cfg['tensor_model_parallel_size']}", f"PP{cfg['pipeline_model_parallel_size']}"]
    if cfg.get("context_parallel_size", 1) > 1:
        parts.append(f"CP{cfg['context_parallel_size']}")
    if dp is not None:
        parts.append(f"DP{dp}")
    if cfg.get("virtual_pipeline_model_parallel_size"):
        parts.append(f"VPP{cfg['virtual_pipeline_model_parallel_size']}")
    parts.append(f"mbs{cfg['micro_batch_size']}")
    recompute = cfg.get("recompute_granularity")
    if recompute == "full":
        method = cfg.get("recompute_method") or "uniform"
        parts.append(f"full-{method}{cfg.get('recompute_num_layers') or 1}")
    elif recompute:
        parts.append(recompute)
    parts += [flag for key, flag in (("sequence_parallel", "SP"), ("use_distributed_optimizer", "DistOpt"),
                                     ("tp_comm_overlap", "TPoverlap")) if cfg.get(key)]
    return " ".join(parts)


def print_result(space, result: SearchResult, *, top: int = 10, console: Console | None = None) -> None:
    console = console or make_console()
    several_gpus = len(space.choices["num_gpus"]) > 1
    cost = "cost" in space.objectives or space.gpu_hour_cost is not None
    shown = result.top[:top]
    labels, common = short_labels([r["config"] for r in shown], [r["derived"].get("data_parallel_size") for r in shown])
    table = Table(title=f"{space.name}: best {min(top, len(result.top))} of {result.n_feasible} feasible layouts",
                  caption=f"every layout: {common}" if common else None)
    cols = ["#", "trial", "step time", "MFU", "peak mem"] + (["GPUs"] if several_gpus else []) + \
        (["cost/step"] if cost else []) + ["layout"]
    for col in cols:
        table.add_column(col, justify="left" if col == "layout" else "right")
    for i, rec in enumerate(result.top[:top], 1):
        cfg = rec["config"]
        row = [str(i), str(rec["trial"]), human_time(rec["step_time_s"]), f"{100 * rec['mfu']:.1f}%",
               human_bytes(rec["peak_memory_bytes"])]
        row += [str(cfg["num_gpus"])] if several_gpus else []
        row += [f"{rec['cost_per_step']:.4g}"] if cost else []
        row.append(labels[i - 1])
        table.add_row(*row)
    console.print(table)
    if result.pareto:
        front = Table(title=f"Pareto front ({' vs '.join(space.objectives)})")
        for col in ["trial"] + list(space.objectives) + ["layout"]:
            front.add_column(col, justify="left" if col == "layout" else "right")
        for e in result.pareto:
            front.add_row(str(e["trial"]), *[f"{e['objectives'][o]:.4g}" for o in space.objectives],
                          layout_label(e["config"], e["derived"].get("data_parallel_size")))
        console.print(front)
    console.print(f"{result.sampler}: {result.n_trials} trials ({result.new_trials} new), {result.n_feasible} "
                  f"feasible, {result.n_infeasible} over memory, {result.n_rejected} rejected; "
                  f"{result.space_size} valid layouts in the space; {result.wall_time_s:.1f} s")
    if result.best is not None:
        best = result.best
        console.print(f"[bold green]best: {human_time(best['step_time_s'])} per step[/bold green] "
                      f"(trial {best['trial']}, MFU {100 * best['mfu']:.1f}%, {best['memory_verdict']})")
        console.print(f"Megatron-LM flags: {best['megatron_args']}", highlight=False, markup=False)
    else:
        console.print("[bold red]no feasible layout: every simulated layout exceeds GPU memory[/bold red]")
    console.print(f"[dim]results in {result.results_dir}/ (study storage: {result.storage})[/dim]")
    for note in result.notes:
        console.print(f"[dim]note: {note}[/dim]")
