"""Tables that never lose a number, at any terminal width, and the same table as CSV or Markdown.

``plan``, ``rank`` and ``search`` build a ``TextTable`` (headers, cells as text) and print it with
``print_table(table, fmt)``:

- ``table``: a rich table fitted to the console's width. Every column has a priority; the columns of priority
  0 (the booking numbers) are always shown, the others are added in priority order while the table still
  fits, each at no less than its widest number and its longest word, so rich never has to cut a cell. What
  does not fit is folded into one line per row under the table (``#1 layout: ...; MFU: ...``). When even
  the priority-0 columns do not fit, each row becomes a vertical card (``header: value`` lines).
- ``csv`` and ``markdown``: every column, cells as shown (without colour markup), for spreadsheets and docs.

JSON is each command's own object (``--format json``), not built here.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table
from rich.text import Text
from echo_tune.console import escape_controls, make_console
from echo_tune.errors import ConfigError

FORMATS = ("table", "csv", "markdown", "json")


@dataclass(frozen=True, kw_only=True)
class Column:
    header: str
    priority: int = 0
    """0: always shown (booking numbers); higher: added later, folded under the table first when narrow."""
    wrap: bool = False
    """Text that may wrap between words (layouts, notes); numbers never wrap."""
    justify: str = "right"


@dataclass(kw_only=True)
class TextTable:
    title: str
    columns: list[Column]
    rows: list[list[str]] = field(default_factory=list)
    """Cells as text; rich markup allowed (``[red]no[/red]``), dropped in CSV and Markdown."""
    caption: str | None = None
    row_names: list[str] | None = None
    """How a folded line or a card names its row (default: the first cell)."""
    fold: str = "lines"
    """Where the columns that do not fit go: ``lines`` (one line per row under the table) or ``pages`` (further
    tables of the same rows, the first column repeated: for numeric tables whose headers are long)."""

    def add_row(self, *cells: str) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"a row needs {len(self.columns)} cells, got {len(cells)}")
        self.rows.append([str(c) for c in cells])


def plain(cell: str) -> str:
    """The cell's text without markup, control characters escaped as printed (so widths are the printed ones)."""
    return Text.from_markup(escape_controls(cell)).plain  # before rich, which drops a carriage return


def _min_width(col: Column, cells: list[str]) -> int:
    """The narrowest the column can be without cutting a number or a word."""
    words = [w for c in cells for w in plain(c).split()] if col.wrap else [plain(c) for c in cells]
    return max([len(w) for w in col.header.split()] + [len(w) for w in words] + [1])


def _table_width(widths: list[int]) -> int:
    """Width of a rich table (default box, padding 1) with these column widths."""
    return sum(widths) + 3 * len(widths) + 1


def fit_columns(table: TextTable, width: int) -> list[int] | None:
    """Indices of the columns shown at ``width`` (None: not even the priority-0 columns fit)."""
    mins = [_min_width(col, [r[i] for r in table.rows]) for i, col in enumerate(table.columns)]
    keep = [i for i, col in enumerate(table.columns) if col.priority == 0]
    if _table_width([mins[i] for i in keep]) > width:
        return None
    for i in sorted((i for i, c in enumerate(table.columns) if c.priority > 0),
                    key=lambda i: (table.columns[i].priority, i)):
        if _table_width([mins[j] for j in keep + [i]]) <= width:
            keep.append(i)
    return sorted(keep)


def _widths(table: TextTable, shown: list[int], width: int) -> list[int]:
    """Each shown column's width: its minimum, then spare room up to its longest line, by priority."""
    cells = {i: [plain(r[i]) for r in table.rows] for i in shown}
    mins = {i: _min_width(table.columns[i], cells[i]) for i in shown}
    natural = {i: max([len(table.columns[i].header)] + [len(c) for c in cells[i]]) for i in shown}
    out = dict(mins)
    spare = width - _table_width(list(mins.values()))
    for i in sorted(shown, key=lambda i: (table.columns[i].priority, i)):  # the most important first
        extra = max(0, min(spare, natural[i] - out[i]))
        out[i] += extra
        spare -= extra
    return [out[i] for i in shown]


def _rich_table(table: TextTable, shown: list[int], width: int) -> Table:
    out = Table(title=table.title, caption=table.caption)
    for i, w in zip(shown, _widths(table, shown, width)):
        col = table.columns[i]
        out.add_column(Text(escape_controls(col.header), no_wrap=False), justify=col.justify, no_wrap=not col.wrap, overflow="fold",
                       width=w)
    for r in table.rows:
        out.add_row(*[r[i] for i in shown])
    return out


def _name(table: TextTable, k: int) -> str:
    return table.row_names[k] if table.row_names else plain(table.rows[k][0])


def print_table(table: TextTable, fmt: str = "table", console: Console | None = None) -> None:
    """Print ``table`` as ``fmt`` (table, csv or markdown) on ``console`` (default: ``make_console()``)."""
    console = console or make_console()
    if fmt in ("csv", "markdown"):  # written past rich: control characters escaped here (console.py)
        console.file.write(escape_controls(to_csv(table) if fmt == "csv" else to_markdown(table) + "\n"))  # Markdown: a blank
        # line ends the table (a line right after it would be read as one more row)
        console.file.flush()
        return
    shown = fit_columns(table, console.width)
    if shown is None:  # vertical cards, one per row
        console.print(Text(table.title, style="italic"))
        for k, r in enumerate(table.rows):
            console.print(Text(_name(table, k), style="bold"))
            for col, cell in zip(table.columns, r):
                console.print(Text("  " + col.header + ": ") + Text.from_markup(escape_controls(cell)))
        if table.caption:
            console.print(Text(table.caption, style="dim"))
        return
    console.print(_rich_table(table, shown, console.width))
    dropped = [i for i in range(len(table.columns)) if i not in shown]
    if table.fold == "pages":
        while dropped:
            rest = TextTable(title=f"{table.title} (continued)", columns=[table.columns[0]] + [
                dataclasses.replace(table.columns[i], priority=1) for i in dropped],
                rows=[[r[0]] + [r[i] for i in dropped] for r in table.rows])
            page = fit_columns(rest, console.width) or [0]
            if page == [0]:  # not even one more column beside the first: one column at a time, as cards
                page = [0, 1]
            console.print(_rich_table(rest, page, console.width))
            dropped = [dropped[j - 1] for j in range(1, len(rest.columns)) if j not in page]
        return
    for k, r in enumerate(table.rows):
        parts = [Text(f"{table.columns[i].header}: ") + Text.from_markup(escape_controls(r[i])) for i in dropped
                 if plain(r[i]) not in ("", "-")]
        if parts:
            console.print(Text(f"{_name(table, k)}: ", style="bold") + Text("; ").join(parts))


def note_printer(console: Console, fmt: str):
    """``(line, style)`` for the notes printed under a table: ``line(text)`` prints one paragraph (soft-wrapped
    except in a terminal table; followed by a blank line in Markdown), ``style(name)`` is the rich style in a
    terminal table and none in the plain formats."""
    def style(name: str) -> str:
        return name if fmt == "table" else ""

    def line(text, **kw) -> None:
        console.print(text, soft_wrap=fmt != "table", **kw)
        if fmt == "markdown":  # a paragraph of its own
            console.print()

    return line, style


def to_csv(table: TextTable) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow([c.header for c in table.columns])
    writer.writerows([[plain(c) for c in r] for r in table.rows])
    return buf.getvalue()


def to_markdown(table: TextTable) -> str:
    def cell(text: str) -> str:
        return plain(text).replace("|", "\\|").replace("\n", " ")

    lines = [f"**{table.title}**", "", "| " + " | ".join(cell(c.header) for c in table.columns) + " |",
             "|" + "|".join("---:" if c.justify == "right" else ":---" for c in table.columns) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in table.rows]
    if table.caption:
        lines += ["", table.caption]
    return "\n".join(lines) + "\n"


def add_format_arguments(parser, csv_note: str) -> None:
    """``--format table|csv|markdown|json`` and ``--json`` (its older spelling) of plan, rank and search."""
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help=f"table (default: fitted to the terminal or COLUMNS, 160 columns in a pipe, never "
                             f"cutting a number), csv ({csv_note}), markdown or json (one object)")
    parser.add_argument("--json", action="store_true", help="the same as --format json")


def output_format(args) -> str:
    """``--format``, with ``--json`` as its older spelling."""
    if args.json and args.format not in (None, "json"):
        raise ConfigError(f"give --json or --format, not both, but got (--json, --format {args.format})")
    return "json" if args.json else (args.format or "table")
