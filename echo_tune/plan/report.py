"""The planner's table and explanation, for the terminal."""

from __future__ import annotations

from rich.console import Console

from echo_tune.console import make_console
from rich.table import Table


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def plan_table(rows: list[dict], currency: str, title: str) -> Table:
    from echo_tune.plan.labels import short_labels

    shown = [r for r in rows if r["feasible"]]
    labels, common = short_labels([r["config"] for r in shown],
                                  [r["data_parallel_size"] for r in shown])
    label_of = {id(r): label for r, label in zip(shown, labels)}
    table = Table(title=title, caption=f"every layout: {common}" if common else None)
    cols = ["#", "candidate", "layout", "step", "tokens/s", "MFU", "headroom", "days", "GPU-hours",
            f"cost ({currency})", "error band", "notes"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("candidate", "layout", "notes") else "right",
                         overflow="fold", no_wrap=col in ("candidate", "step", "MFU", "headroom", "error band"))
    for i, r in enumerate(rows, 1):
        band = r["error_band"]
        band_text = band["text"] if r["feasible"] else "-"
        notes = [] if band["match"] == "exact" or not r["feasible"] else [
            f"band of nearest validated family {band['family']}" if band["match"] == "nearest"
            else "outside every validated family (band of all runs)"]
        if not r["feasible"]:
            miss = r["closest_miss"]
            notes.append("infeasible: no layout fits in memory" + (
                f"; closest miss {miss['layout']} over by {miss['over_gib']:.1f} GiB" if miss else ""))
        if r.get("meets_deadline") is False:
            notes.append("misses the deadline")
        if r.get("within_budget") is False:
            notes.append("over budget")
        if r["feasible"] and r["gpu_hour_price"] is None:
            notes.append("no price given")
        days = None if r["days"] is None else f"{r['days']:.1f} ({r['days_band'][0]:.1f}-{r['days_band'][1]:.1f})"
        table.add_row(str(i), r["candidate"], label_of.get(id(r), "-"), _num(r["step_time_s"], ".3f") + (
            " s" if r["step_time_s"] is not None else ""), _num(r["tokens_per_s"], ",.0f"),
            "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
            "-" if r["headroom_gib"] is None else f"{r['headroom_gib']:.1f} GiB", days or "-",
            _num(r["gpu_hours"], ",.0f"), _num(r["cost"], ",.0f"), band_text, "; ".join(notes))
    return table


def explanation_tables(explanation: dict) -> tuple[Table, Table]:
    fams = explanation["families"]
    parts = sorted({p for f in fams for p in f["breakdown_s"]},
                   key=lambda p: -max(f["breakdown_s"].get(p, 0.0) for f in fams))
    breakdown = Table(title="winner's breakdown beside the best layout of each other TP x PP x CP family (s/step)",
                      caption=f"every layout: {fams[0]['common']}" if fams[0]["common"] else None)
    breakdown.add_column("part")
    for i, f in enumerate(fams):
        breakdown.add_column(("winner: " if i == 0 else "") + f["label"], justify="right")
    for p in parts:
        breakdown.add_row(p, *[f"{f['breakdown_s'].get(p, 0.0):.3f}" for f in fams])
    breakdown.add_row("step", *[f"{f['step_time_s']:.3f}" for f in fams])
    breakdown.add_row("headroom GiB", *[f"{f['headroom_gib']:.1f}" for f in fams])
    sens = Table(title="sensitivity: step time (s) of the top families' best layouts when an assumption fails")
    sens.add_column("assumption")
    top = fams[:len(explanation["sensitivity"][0]["step_time_s"])]
    for f in top:
        sens.add_column(f["family"], justify="right")
    sens.add_column("fastest")
    for s in explanation["sensitivity"]:
        sens.add_row(s["assumption"], *[_num(t, ".3f") for t in s["step_time_s"]],
                     top[s["fastest"]]["family"] if s["fastest"] is not None else "none fits")
    return breakdown, sens


def print_plan(result, explanation: dict | None, *, sort: str, console: Console | None = None) -> None:
    console = console or make_console()
    title = (f"plan: {result.model}, {result.tokens:.3g} tokens, global batch {result.global_batch_size}, "
             f"sorted by {sort}")
    console.print(plan_table(result.rows, result.currency, title))
    console.print("[dim]error band: how much longer (+) or shorter (-) the validated runs of the prediction's family "
                  "took than predicted, lowest..highest (n runs); days in brackets: the same range applied[/dim]",
                  highlight=False)
    winner = result.winner
    if winner is None:
        console.print("[bold red]no candidate has a layout that fits in memory[/bold red]")
        return
    cost = "" if winner["cost"] is None else f", {winner['cost']:,.0f} {result.currency}"
    misses = [text for key, text in (("meets_deadline", "misses the deadline"), ("within_budget", "is over budget"))
              if winner.get(key) is False]
    if misses:
        console.print(f"[bold yellow]no candidate meets the deadline and budget; the fastest one "
                      f"{' and '.join(misses)}[/bold yellow]")
    console.print(f"[bold green]recommended: {winner['candidate']}[/bold green] with {winner['layout']}: "
                  f"{winner['days']:.1f} days{cost} ({winner['error_band']['note']})", highlight=False)
    console.print(f"Megatron-LM flags: {winner['megatron_args']}", highlight=False, markup=False)
    if explanation is not None:
        breakdown, sens = explanation_tables(explanation)
        console.print(breakdown)
        console.print(explanation["why"], highlight=False)
        console.print(sens)
    for note in result.notes:
        console.print(f"[dim]note: {note}[/dim]", highlight=False)
    console.print(f"[dim]studies in {', '.join(r['study'] for r in result.rows)} (run again to reuse them)[/dim]")
