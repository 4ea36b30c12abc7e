"""Files a search leaves in ``results/<study-name>/``.

``trials.csv``        every trial: settings by Megatron name, the report's parts, feasibility, broken rule
``best.json``         the best feasible layout (the simulator's keys, its Megatron flags)
``megatron_args.txt`` the best layout as Megatron-LM flags, one per line, ready for a launch script
``best_trace.json``   the best layout's simulated step as a Chrome trace (open in https://ui.perfetto.dev)
``pareto.csv``        multi-objective runs: the feasible Pareto front
``pareto.svg``        multi-objective runs: every feasible trial and the front, first two objectives

Each is written atomically (``echo_tune.io``: temporary file, then ``os.replace``) and never through a
symbolic link: a resumed study whose folder holds ``best.json -> elsewhere`` is refused in one line.
"""

from __future__ import annotations

import functools
import json
from concurrent.futures import Future
from pathlib import Path

from echo_tune.config.launch.launch_notes import launch_notes
from echo_tune.io import atomic_path, check_not_symlink, write_text
from echo_tune.limits import MAX_SIMULATED_MICRO_BATCHES
from echo_tune.plots import available, plot_breakdowns, plot_pareto
from echo_tune.search.space.labels import short_labels
# The names a study writes live in search/storage/manifest.py, which --overwrite reads; re-exported here.
from echo_tune.search.storage.manifest import MANIFEST_NAME, OUTPUT_NAMES, record  # noqa: F401
from echo_tune.search.engines.objective import OBJECTIVE_KEYS, evaluate, objective_label
from echo_tune.search.outputs.plot import pareto_svg
from echo_tune.search.outputs.results import candidate_of, megatron_flags
from echo_tune.search.space.search_space import SearchSpace
from echo_tune.search.storage.storage_checks import link_refusal
from echo_tune.search.outputs.trials_csv import TrialsCsv
from echo_tune.sim.outputs.trace_export import write_chrome_trace



def check_outputs(out_dir: Path) -> None:
    """Refuse (one line) a study folder that is a symbolic link, or holds one where an output goes, before any
    work."""
    if Path(out_dir).is_symlink():
        raise link_refusal(Path(out_dir), "study folder")
    for name in OUTPUT_NAMES + (MANIFEST_NAME,):
        check_not_symlink(Path(out_dir) / name, "search output")


def write_trials_csv(space: SearchSpace, trials, path: Path, built: TrialsCsv | None = None) -> None:
    """One row per trial (``trials_csv.TrialsCsv``). ``built``: the rows already built as the trials were
    stored, used when it holds every trial."""
    if built is None or built.count != len(trials):
        built = TrialsCsv(space)
        built.add(sorted(trials, key=lambda t: t.number))
    write_text(path, built.text(), "trials file")


def write_megatron_args(space: SearchSpace, best: dict, path: Path, *, study_name: str) -> None:
    record = {"config": best["config"]}
    flags = megatron_flags(space, record)
    num_gpus, node = best["config"]["num_gpus"], space.cluster.gpus_per_node
    nodes, per_node = (num_gpus // node, node) if num_gpus >= node else (1, num_gpus)
    lines = [f"# echo-tune search, study {study_name}: best layout for {space.model.name} on {num_gpus} x "
             f"{space.cluster.name}",
             f"# simulated step time {best['step_time_s']:.3f} s, MFU {100 * best['mfu']:.1f}%"
             f"{' of the BF16 peak' if best['config'].get('fp8_format') else ''}, "
             f"{best['memory_verdict']}",
             f"# world size {num_gpus} = {nodes} node(s) x {per_node} GPU(s) (set by the launcher, e.g. torchrun); "
             f"data-parallel size {best['derived'].get('data_parallel_size')}",
             "# model and layout flags only (data, tokenizer, schedule and checkpoint flags are yours to add); a "
             "config.json setting with no flag here is named in the search's notes"]
    lines += [f"# note: {note}" for note in launch_notes(best["config"])]
    pairs: list[str] = []
    for flag in flags:  # "--flag value" on one line, switches alone
        if flag.startswith("--") or not pairs:
            pairs.append(flag)
        else:
            pairs[-1] += f" {flag}"
    write_text(path, "\n".join(lines + pairs) + "\n", "Megatron flags file")


def write_trace(space: SearchSpace, best: dict, path: Path, *, profile=None) -> None:
    _, report = evaluate(space, candidate_of(space, {"config": best["config"]}), profile=profile, timeline=True)
    write_chrome_trace(report, path)


def write_pareto(space: SearchSpace, pareto: list[dict], all_points: list[tuple[float, ...]], csv_path: Path,
                 svg_path: Path) -> None:
    rows = []
    for e in pareto:
        row = {"trial": e["trial"], **{OBJECTIVE_KEYS[o]: e["objectives"][o] for o in space.objectives}}
        row.update(e["config"])
        row.update({k: e[k] for k in ("tokens_per_s", "mfu", "peak_memory_bytes")})
        row["megatron_args"] = e["megatron_args"]
        rows.append(row)
    import pandas as pd  # only here: importing it cost every search ~0.2 s

    with atomic_path(csv_path, "Pareto file") as tmp:
        pd.DataFrame(rows).to_csv(tmp, index=False)
    objs = space.objectives[:2]
    front = [tuple(e["objectives"][o] for o in objs) for e in pareto]
    labels = [objective_label(o, space.gpu_hour_cost, space.currency) for o in objs]
    write_text(svg_path, pareto_svg([p[:2] for p in all_points], front, labels,
                                   title=f"{space.name}: feasible layouts and Pareto front"), "Pareto plot")

    names, _ = short_labels([e["config"] for e in pareto], [e["derived"].get("data_parallel_size") for e in pareto])
    plot_pareto([p[:2] for p in all_points], front, labels, svg_path.with_suffix(".png"),
                title=f"{space.name}: feasible layouts and Pareto front", front_labels=names)


def start_outputs(space: SearchSpace, out_dir: Path, feasible: list[tuple[int, dict]], pool=None):
    """Check and create the results folder, and start the breakdown plot of the best ``feasible`` (number,
    record) rows: drawn by ``pool``'s idle worker (a Future of its path) while this process works out the
    best layout, the Pareto front and the other files; drawn here (its path, or None) without a pool. Its
    result goes to ``write_outputs``. Started after those, the summary of a two-process Qwen3-30B-A3B search
    waited ~0.25 s for it."""
    check_outputs(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return _top_breakdowns(space, [r for _, r in feasible], out_dir / "breakdowns.png", pool=pool)


def write_outputs(space: SearchSpace, study, out_dir: Path, *, best: dict | None, pareto: list[dict],
                  feasible: list[tuple[int, dict]], profile=None, png=None,
                  built_rows: TrialsCsv | None = None) -> list[str]:
    """Write every output file; returns their paths. ``feasible``: the study's feasible (number, record)
    rows; ``png``: what ``start_outputs`` returned; ``built_rows``: trials.csv's rows built as the trials were
    stored (``write_trials_csv``)."""
    trials = study.get_trials(deepcopy=False)
    files = []
    path = out_dir / "trials.csv"
    write_trials_csv(space, trials, path, built_rows)
    files.append(path)
    if best is not None:
        path = out_dir / "best.json"
        write_text(path, json.dumps(best, indent=2, default=str) + "\n", "best layout file")
        files.append(path)
        path = out_dir / "megatron_args.txt"
        write_megatron_args(space, best, path, study_name=study.study_name)
        files.append(path)
        path = out_dir / "best_trace.json"
        # a timeline records every task; above this many micro-batches it is not written (issue 10)
        if best["derived"].get("num_micro_batches", 0) <= MAX_SIMULATED_MICRO_BATCHES:
            write_trace(space, best, path, profile=profile)
            files.append(path)
    if len(space.objectives) > 1 and pareto:
        keys = [OBJECTIVE_KEYS[o] for o in space.objectives]
        points = [tuple(float(record[k]) for k in keys) for _, record in feasible]
        csv_path, svg_path = out_dir / "pareto.csv", out_dir / "pareto.svg"
        write_pareto(space, pareto, points, csv_path, svg_path)
        files += [csv_path, svg_path] + ([svg_path.with_suffix(".png")] if svg_path.with_suffix(".png").exists() else [])
    if isinstance(png, Future):
        png = png.result()
    if png is not None:
        files.append(png)

    record(out_dir, files)  # what --overwrite may remove, and nothing else (manifest.py)
    return [str(f) for f in files]


def _top_breakdowns(space: SearchSpace, feasible: list[dict], path: Path, top: int = 8, pool=None):
    """The best of the ``feasible`` records' breakdowns as stacked bars (matplotlib, when installed); drawn in
    ``pool`` (a Future of the path) when given."""
    if not available():
        return None
    records = sorted(feasible, key=lambda r: r["step_time_s"])[:top]
    if not records:
        return None
    labels, common = short_labels([r["config"] for r in records], [r["derived"].get("data_parallel_size")
                                                                  for r in records])
    draw = plot_breakdowns if pool is None else functools.partial(pool.submit, plot_breakdowns)
    return draw([{"label": label, "breakdown_s": r["breakdown_s"]} for label, r in zip(labels, records)],
                path, title=f"{space.name}: best layouts' step time by part" + (
                    f"\n(every layout: {common})" if common else ""))
