"""The planner's table and explanation, for the terminal (or CSV / Markdown: echo_tune/tables.py)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from echo_tune.console import make_console
from echo_tune.plan.anchors import faster_than_measured
from echo_tune.plan.bands import band_note
from echo_tune.plan.projection import budget_note, deadline_note, legend
from echo_tune.plan.safety import fit_hint_text, near_tie_text
from echo_tune.search.space.labels import short_labels
from echo_tune.tables import Column, TextTable, print_table


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _dominated(row: dict) -> str:
    n, memory = row.get("n_dominated") or 0, row.get("n_dominated_memory") or 0
    why = [f"{n - memory} of a layout that fits without it" if n - memory else "",
           f"{memory} of a layout over memory without its activations" if memory else ""]
    return f", {n} of them not simulated: recompute variants, {' and '.join(w for w in why if w)}" if n else ""


def mfu_header(rows: list[dict]) -> str:
    """MFU is always of the BF16 peak (Megatron's convention); said so when an FP8 layout is in the table."""
    return "MFU of BF16 peak" if any((r.get("precision") or "").startswith("fp8") for r in rows) else "MFU"


def _row_notes(r: dict) -> list[str]:
    band = r["error_band"]
    notes = [n for n in (band_note(band) if r["feasible"] else None, deadline_note(r)) if n]
    if r.get("error"):  # a candidate that could not be planned (planner.bad_row): its reason, nothing else
        return [r["error"]]
    if not r["feasible"]:
        notes.append("infeasible: no layout fits in memory" + (" (what would fit: below)" if r.get("fit_hint") else ""))
    if r.get("budget") is not None:
        notes += [n for n in (budget_note(r),) if n]
    elif r.get("within_budget") is False:
        notes.append("over budget")
    if r["feasible"] and r["gpu_hour_price"] is None:
        notes.append("no price given" + ("; the budget cannot be checked" if r.get("budget_unknown") else ""))
    if r.get("memory_band") == "at risk":  # fits by the prediction, by less than its measured error (or just over)
        notes.append(("no layout keeps the memory model's margin; the fastest at risk: " if r.get("fallback_at_risk")
                      else "") + "memory " + r["memory_verdict"])
    if r.get("near_tie"):
        notes.append("a near-tie leaves more memory free (below)")
    measured = r.get("measured_anchor")
    if faster_than_measured(measured):
        notes.append(f"predicted {1 / measured['ratio']:.1f}x faster per token than the fastest published run of "
                     f"this model on this GPU ({measured['run']})")
    return notes


def plan_table(rows: list[dict], currency: str, title: str) -> TextTable:
    shown = [r for r in rows if r["feasible"]]
    labels, common = short_labels([r["config"] for r in shown],
                                  [r["data_parallel_size"] for r in shown])
    label_of = {id(r): label for r, label in zip(shown, labels)}
    table = TextTable(title=title, caption=f"every layout: {common}" if common else None, columns=[
        Column(header="#"), Column(header="candidate", wrap=True, justify="left"),
        Column(header="precision", priority=1, wrap=True), Column(header="layout", priority=2, wrap=True,
                                                                  justify="left"),
        Column(header="step", priority=3), Column(header="tokens/s", priority=1),
        Column(header=mfu_header(rows), priority=3), Column(header="free HBM", priority=2),
        Column(header="days"), Column(header="days range", priority=4), Column(header="GPU-hours"),
        Column(header=f"cost ({currency})"), Column(header="cost range", priority=4),
        Column(header="error band", priority=4),
        Column(header="notes", priority=5, wrap=True, justify="left")])
    names = []
    for i, r in enumerate(rows, 1):
        names.append(f"#{i} {r['candidate']}")
        # days and cost: the family's median bias and the goodput applied, the band's range beside (projection.py)
        days_range = "-" if r["days"] is None or not r.get("days_band") else \
            f"{r['days_band'][0]:.1f}-{r['days_band'][1]:.1f}"
        cost_range = "-" if r["cost"] is None or not r.get("cost_band") else \
            f"{r['cost_band'][0]:,.0f}-{r['cost_band'][1]:,.0f}"
        table.add_row(str(i), escape(r["candidate"]), r.get("precision") or "-", escape(label_of.get(id(r), "-")),
                      _num(r["step_time_s"], ".3f") + (" s" if r["step_time_s"] is not None else ""),
                      _num(r["tokens_per_s"], ",.0f"), "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%",
                      "-" if r["headroom_gib"] is None else f"{r['headroom_gib']:.1f} GiB", _num(r["days"], ",.1f"),
                      days_range, _num(r["gpu_hours"], ",.0f"), _num(r["cost"], ",.0f"), cost_range,
                      r["error_band"]["text"] if r["feasible"] else "-", escape("; ".join(_row_notes(r))))
    table.row_names = names
    return table


def explanation_tables(explanation: dict) -> tuple[TextTable, TextTable]:
    fams = explanation["families"]
    # largest first, to the microsecond (below it: float residue, e.g. "other"), then by name: a set's order
    # changes with the process's string hashing, and so did the order of the tied parts from run to run
    parts = sorted({p for f in fams for p in f["breakdown_s"]},
                   key=lambda p: (-round(max(f["breakdown_s"].get(p, 0.0) for f in fams), 6), p))
    breakdown = TextTable(
        title="winner's breakdown beside the best layout of each other TP x PP x CP family (s/step)",
        caption=f"every layout: {fams[0]['common']}" if fams[0]["common"] else None, fold="pages",
        columns=[Column(header="part", wrap=True, justify="left")] + [
            Column(header=("winner: " if i == 0 else "") + f["label"], priority=i, wrap=True)
            for i, f in enumerate(fams)])
    for p in parts:
        breakdown.add_row(p, *[f"{f['breakdown_s'].get(p, 0.0):.3f}" for f in fams])
    breakdown.add_row("step", *[f"{f['step_time_s']:.3f}" for f in fams])
    breakdown.add_row("free HBM GiB", *[f"{f['headroom_gib']:.1f}" for f in fams])
    top = fams[:len(explanation["sensitivity"][0]["step_time_s"])]
    sens = TextTable(title="sensitivity: step time (s) of the top families' best layouts when an assumption fails",
                     fold="pages",
                     columns=[Column(header="assumption", wrap=True, justify="left")]
                     + [Column(header=f["family"], priority=i, wrap=True) for i, f in enumerate(top)]
                     + [Column(header="fastest", wrap=True, justify="left")])
    for s in explanation["sensitivity"]:
        sens.add_row(s["assumption"], *[_num(t, ".3f") for t in s["step_time_s"]],
                     top[s["fastest"]]["family"] if s["fastest"] is not None else "none fits")
    return breakdown, sens


def print_plan(result, explanation: dict | None, *, sort: str, console: Console | None = None,
               fmt: str = "table") -> None:
    """The table (``fmt`` table, csv or markdown; csv prints the planner's table alone), the recommendation,
    its safety notes and the explanation."""
    console = console or make_console()
    seq = f" of {result.seq_length:,}-token sequences" if getattr(result, "seq_length", None) else ""
    title = (f"plan: {result.model}, {result.tokens:.3g} tokens, global batch {result.global_batch_size}{seq}, "
             f"sorted by {sort}")
    print_table(plan_table(result.rows, result.currency, title), fmt, console)
    if fmt == "csv":
        return

    def say(text: str, style: str | None = None) -> None:
        console.print(Text(text, style=style if fmt == "table" and style else ""), highlight=False,
                      soft_wrap=fmt != "table")  # Markdown: one line per paragraph
        if fmt == "markdown":
            console.print()

    say(legend(result.rows), "dim")
    for i, r in enumerate(result.rows, 1):
        if not r["feasible"] and r.get("fit_hint"):
            say(f"#{i} {r['candidate']} does not fit: its closest miss {fit_hint_text(r['fit_hint'], r['gpu'])}",
                "yellow")
    for i, r in enumerate(result.rows, 1):
        if r.get("error"):
            say(f"#{i} {r['candidate']} not planned: {r['error']}", "red")
    winner = result.winner
    if winner is None:
        say("no candidate has a layout that fits in memory", "bold red")
        for note in result.notes:
            say(f"note: {note}", "dim")
        return
    cost = "" if winner["cost"] is None else f", {winner['cost']:,.0f} {result.currency}"
    misses = [text for key, text in (("meets_deadline", "misses the deadline"), ("within_budget", "is over budget"))
              if winner.get(key) is False]
    if misses:
        asked = " and ".join(w for w, key in (("deadline", "meets_deadline"), ("budget", "within_budget"))
                             if winner.get(key) is not None)  # None: not asked (or no price)
        say(f"no candidate meets the {asked}; the recommended one {' and '.join(misses)}", "bold yellow")
    say(f"recommended: {winner['candidate']} in {winner['precision']} with {winner['layout']}: "
        f"{winner['days']:.1f} days{cost} ({winner['error_band']['note']})", "bold green")
    if (winner.get("precision") or "").startswith("fp8"):
        say(f"MFU {100 * winner['mfu']:.1f}% is of the BF16 peak (Megatron-LM's convention), with FP8 GEMMs")
    say(f"Megatron-LM flags: {winner['megatron_args']}")
    for i, r in enumerate(result.rows, 1):
        tie = r.get("near_tie")
        if tie:
            say(f"#{i} {r['candidate']}: {near_tie_text(tie, result.near_tie_pct)}",
                "bold yellow" if r is winner else "yellow")
            if r is winner:
                say(f"its Megatron-LM flags: {tie['megatron_args']}")
    if explanation is not None:
        breakdown, sens = explanation_tables(explanation)
        print_table(breakdown, fmt, console)
        say(explanation["why"])
        print_table(sens, fmt, console)
    for note in result.notes:
        say(f"note: {note}", "dim")
    say("coverage: " + ", ".join(f"{r['candidate']} {r['n_trials']} of {r['space_size']} layouts "
                                 f"{'covered' if r.get('n_dominated') else 'simulated'} ({100 * r['coverage']:.1f}%"
                                 f"{_dominated(r)})" for r in result.rows if "space_size" in r), "dim")
    say(f"studies in {', '.join(r['study'] for r in result.rows if r.get('study'))} (run again to reuse them)", "dim")
