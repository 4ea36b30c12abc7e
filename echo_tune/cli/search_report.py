"""What ``echo-tune search`` prints: the best layouts and the Pareto front (as tables of echo_tune/tables.py),
the counts, the best layout and its Megatron-LM flags."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from echo_tune.cli.common import human_bytes, human_time
from echo_tune.console import make_console
from echo_tune.search.space.labels import short_labels
from echo_tune.search.study import SearchResult
from echo_tune.tables import Column, TextTable, note_printer, print_table


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


def result_tables(space, result: SearchResult, *, top: int = 10) -> list[TextTable]:
    """The best layouts and, for several objectives, the Pareto front."""
    several_gpus = len(space.choices["num_gpus"]) > 1
    cost = "cost" in space.objectives or space.gpu_hour_cost is not None
    shown = result.top[:top]
    labels, common = short_labels([r["config"] for r in shown], [r["derived"].get("data_parallel_size") for r in shown])
    fp8 = any(r["config"].get("fp8_format") for r in shown)
    cols = [Column(header="#"), Column(header="trial", priority=2), Column(header="step time"),
            Column(header="MFU of BF16 peak" if fp8 else "MFU", priority=1), Column(header="peak mem", priority=1)]
    cols += [Column(header="GPUs")] if several_gpus else []
    cols += [Column(header=f"cost/step ({space.currency})" if space.gpu_hour_cost is not None
                    else "GPU-hours/step")] if cost else []
    cols.append(Column(header="layout", priority=1, wrap=True, justify="left"))
    cols.append(Column(header="variants", priority=2, wrap=True, justify="left"))
    table = TextTable(title=f"{space.name}: best {min(top, len(result.top))} of {result.n_feasible} feasible layouts "
                            f"(a row: a layout's best VPP / recompute variant; variants: those feasible)",
                      caption=f"every layout: {common}" if common else None, columns=cols)
    for i, rec in enumerate(shown, 1):
        cfg = rec["config"]
        row = [str(i), str(rec["trial"]), human_time(rec["step_time_s"]), f"{100 * rec['mfu']:.1f}%",
               human_bytes(rec["peak_memory_bytes"])]
        row += [str(cfg["num_gpus"])] if several_gpus else []
        row += [f"{rec['cost_per_step']:.4g}"] if cost else []
        row.append(escape(labels[i - 1]))
        n, span = rec.get("variants", 1), rec.get("variant_span")
        row.append(escape(f"{n} ({span})" if span else str(n)))
        table.add_row(*row)
    tables = [table]
    if result.pareto:
        front = TextTable(title=f"Pareto front ({' vs '.join(space.objectives)})", columns=[
            Column(header="trial")] + [Column(header=o) for o in space.objectives] + [
            Column(header="layout", priority=1, wrap=True, justify="left")])
        for e in result.pareto:
            front.add_row(str(e["trial"]), *[f"{e['objectives'][o]:.4g}" for o in space.objectives],
                          escape(layout_label(e["config"], e["derived"].get("data_parallel_size"))))
        tables.append(front)
    return tables


def print_result(space, result: SearchResult, *, top: int = 10, console: Console | None = None,
                 fmt: str = "table", header: list[str] | None = None) -> None:
    console = console or make_console()
    if fmt != "csv":
        console.print(f"model {space.model.name}: seq_length {space.model.seq_length:,} tokens per sequence",
                      highlight=False, markup=False)
        for note in (header or [])[1:]:  # what reading a config.json assumed, under the length line
            console.print(note, highlight=False, markup=False, style="dim" if fmt == "table" else "")
    tables = result_tables(space, result, top=top)
    for table in tables if fmt != "csv" else tables[:1]:
        print_table(table, fmt, console)
    if fmt == "csv":
        return
    line, style = note_printer(console, fmt)

    slower, cannot_fit = result.n_dominated - result.n_dominated_memory, result.n_dominated_memory
    dominated = "".join([
        f", {slower} not simulated (the same layout without recompute fits, and recompute only adds work)"
        if slower else "",
        f", {cannot_fit} not simulated (the same layout without recompute is over memory in what recompute does "
        f"not change)" if cannot_fit else ""])
    untimed = f" ({result.n_untimed} of them by more than the memory model's error: step not simulated)" \
        if result.n_untimed else ""
    line(Text(f"{result.sampler}: {result.n_trials} trials ({result.new_trials} new), {result.n_feasible} "
              f"feasible, {result.n_infeasible} over memory{untimed}, {result.n_rejected} rejected{dominated}; "
              f"coverage: {result.n_trials} of the {result.space_size} valid layouts in the space "
              f"{'covered' if result.n_dominated or result.n_untimed else 'simulated'} "
              f"({100 * result.coverage:.1f}%); "
              f"{result.wall_time_s:.1f} s"))
    short = [n for n in result.notes if n.startswith("short search:")]  # said before the recommendation
    for note in short:
        line(Text(f"note: {note}", style=style("bold yellow")))
    if result.best is not None:
        best = result.best
        fp8 = " of the BF16 peak, FP8 GEMMs" if best["config"].get("fp8_format") else ""
        line(Text(f"best: {human_time(best['step_time_s'])} per step", style=style("bold green"))
             + Text(f" (trial {best['trial']}, MFU {100 * best['mfu']:.1f}%{fp8}, {best['memory_verdict']})"))
        console.print(f"Megatron-LM flags: {best['megatron_args']}", highlight=False, markup=False)
    else:
        line(Text("no feasible layout: every simulated layout exceeds GPU memory", style=style("bold red")))
    line(Text(f"results in {result.results_dir}/ (study storage: {result.storage})", style=style("dim")))
    for note in result.notes:
        if note not in short:
            line(Text(f"note: {note}", style=style("dim")))
