"""echo_tune/tables.py: columns fitted to the width without cutting a number; folded lines, pages, cards."""

import io

from rich.console import Console

from echo_tune.tables import Column, TextTable, fit_columns, print_table, to_csv, to_markdown


def _table(fold="lines"):
    t = TextTable(title="t", fold=fold, columns=[
        Column(header="#"), Column(header="name", wrap=True, justify="left"), Column(header="GPU-hours"),
        Column(header="layout", priority=2, wrap=True, justify="left"), Column(header="MFU of BF16 peak", priority=1)])
    t.add_row("1", "256 x h100", "1,048,242", "TP4 PP8 recompute=selective", "45.1%")
    t.add_row("2", "512 x a100-80gb", "595,277", "TP8 PP4 recompute=none", "[green]52.1%[/green]")
    return t


def _render(table, width):
    buf = io.StringIO()
    print_table(table, "table", Console(width=width, file=buf))
    return buf.getvalue()


def test_columns_join_by_priority_while_they_fit():
    t = _table()
    assert fit_columns(t, 200) == [0, 1, 2, 3, 4]
    assert fit_columns(t, 42) == [0, 1, 2, 4]  # the layout (priority 2) folds first
    assert fit_columns(t, 20) is None  # not even #, name and GPU-hours: cards


def test_every_number_whole_at_every_width():
    for width in (20, 30, 42, 60, 200):
        out = _render(_table(), width)
        assert "…" not in out
        for number in ("1,048,242", "595,277", "45.1%", "52.1%", "recompute=selective"):
            assert any(number in line for line in out.splitlines()), (width, number, out)
        assert max(len(line) for line in out.splitlines()) <= width


def test_folded_lines_cards_and_pages():
    out = _render(_table(), 42)
    assert "1: layout: TP4 PP8" in out  # the folded column, named by its row
    cards = _render(_table(), 24)
    assert "  GPU-hours: 1,048,242" in cards and "┃" not in cards
    pages = _render(_table("pages"), 42)
    assert "t (continued)" in pages and "recompute=none" in pages


def test_csv_and_markdown_hold_every_column_without_markup():
    t = _table()
    t.add_row("3", "a | b", "7", "x", "1%")
    csv_text = to_csv(t)
    assert csv_text.splitlines()[0] == "#,name,GPU-hours,layout,MFU of BF16 peak"
    assert '"1,048,242"' in csv_text and "[green]" not in csv_text
    md = to_markdown(t)
    assert "| 2 | 512 x a100-80gb | 595,277 | TP8 PP4 recompute=none | 52.1% |" in md
    assert "a \\| b" in md


def test_escaped_brackets_survive_every_format():
    from rich.markup import escape

    t = TextTable(title="t", columns=[Column(header="#"), Column(header="layout", wrap=True, justify="left")])
    t.add_row("1", escape("pipeline_model_parallel_layout=[Et|tL]"))
    for width in (60, 120):
        assert "pipeline_model_parallel_layout=[Et|tL]" in _render(t, width)
    assert "[Et|tL]" in to_csv(t) and "[Et\\|tL]" in to_markdown(t)
