"""``trials.csv``'s text, built a batch of trials at a time.

One row per trial (``results.trial_row``), columns in order of first appearance (as ``pandas.DataFrame(rows)``
orders them), written with the csv module: an unset word setting (``CATEGORICAL_FIELDS``) as ``none``, the space
files' spelling, so pandas reads it back as the word; any other unset value empty.

A search with several processes adds each batch as it is stored (``exhaustive._store``), so the rows are built
and formatted while the workers simulate, not after the run (~0.9 s of the Qwen3-30B-A3B space's 43,194 trials,
this process alone); the summary then only writes the text. Rows formatted before a later row brought a new
column are formatted again at the end, so the bytes are those of building every row at once (tested).
"""

from __future__ import annotations

import csv
import io

from echo_tune.search.outputs.results import trial_row

CATEGORICAL_FIELDS = ("recompute_granularity", "recompute_method", "fp8_format")
"""Layout settings whose values are words; unset (None) is written ``none``, as in space files."""


def spell_none(row: dict) -> dict:
    """``row`` with its CATEGORICAL_FIELDS' None written ``none`` (in place; returned)."""
    for c in CATEGORICAL_FIELDS:
        if c in row and row[c] is None:
            row[c] = "none"
    return row


class TrialsCsv:
    """The rows of trials numbered 0, 1, 2, ... in that order (``add`` them in order), as CSV text."""

    def __init__(self, space) -> None:
        self._space = space
        self._columns: list[str] = []
        self._known: set[str] = set()
        self._chunks: list[tuple[int, list[dict], str]] = []  # (columns when formatted, its rows, their lines)
        self.count = 0

    def add(self, trials, first_number: int | None = None) -> None:
        """Add ``trials`` (numbered from ``first_number``: the trials of a batch not stored yet carry no number)."""
        rows = []
        for i, trial in enumerate(trials):
            row = trial_row(self._space, trial)
            if first_number is not None:
                row["trial"] = first_number + i
            rows.append(spell_none(row))
        start = 0
        for i, row in enumerate(rows):  # a new column closes the chunk formatted with the columns before it
            if row.keys() <= self._known:
                continue
            new = [k for k in row if k not in self._known]
            if new:
                self._format(rows[start:i])
                start = i
                self._columns += new
                self._known.update(new)
        self._format(rows[start:])
        self.count += len(rows)

    def _format(self, rows: list[dict]) -> None:
        if rows:
            self._chunks.append((len(self._columns), rows, _lines(rows, self._columns)))

    def text(self) -> str:
        """The header and every row, each with every column."""
        out = [_lines([], self._columns, header=True)]
        for width, rows, lines in self._chunks:
            out.append(lines if width == len(self._columns) else _lines(rows, self._columns))
        return "".join(out)


def _lines(rows: list[dict], columns: list[str], *, header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if header:
        writer.writerow(columns)
    for r in rows:
        writer.writerow(map(r.get, columns))  # a missing column is None, which csv writes empty
    return buffer.getvalue()
