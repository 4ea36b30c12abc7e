"""The rich console every table is printed on.

On a terminal rich fits tables to its width; without one (a batch job's log, a pipe) it assumes 80
columns and squeezes wide tables until whole columns vanish. Off a terminal we print 160 columns wide, so
a log holds every column, unless ``COLUMNS`` sets the width (``COLUMNS=80 echo-tune plan ... | less``).
``COLUMNS=0`` (no width at all; rich printed nothing) is ignored, and a width under ``MIN_WIDTH`` is raised
to it (``COLUMNS=1`` printed one character per line).

Text from files and names (a config.json's ``_name_or_path``, a ``--study-name``, a folder's file names) is
printed with its control characters escaped (``ESC`` as ``\\x1b``; issue 41): an ANSI sequence planted there
cannot recolour, move the cursor in, or retitle the user's terminal, nor hide text in a log. Tabs and line
breaks stay. Rich's own styling is not text and is unaffected.
"""

from __future__ import annotations

import os
import re
import shutil

from rich.console import Console
from rich.segment import Segment
from rich.text import Span, Text

LOG_WIDTH = 160
MIN_WIDTH = 40
"""The narrowest console: below it even a card's ``header: value`` lines break in every word."""
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters other than tab and line feed (C0, DEL, C1)."""


def escape_controls(text: str) -> str:
    """``text`` with each control character written as ``\\xNN``."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text) if CONTROL.search(text) else text


def escape_text(text: Text) -> Text:
    """A rich ``Text`` with its control characters escaped, its styled spans kept on the same characters."""
    plain = text.plain
    if not CONTROL.search(plain):
        return text
    shift, offsets = 0, []
    for ch in plain:  # offsets[i]: where character i lands once every control before it is 4 characters
        offsets.append(shift)
        shift += 3 if CONTROL.match(ch) else 0
    offsets.append(shift)
    out = text.blank_copy(escape_controls(plain))
    out.spans = [Span(s.start + offsets[min(s.start, len(plain))], s.end + offsets[min(s.end, len(plain))], s.style)
                 for s in text.spans]
    return out


class SafeConsole(Console):
    """A rich ``Console`` that escapes control characters in what it is given to print."""

    def render_str(self, text: str, **kwargs) -> Text:
        return super().render_str(escape_controls(text), **kwargs)

    def print(self, *objects, **kwargs) -> None:
        super().print(*(escape_text(o) if isinstance(o, Text) else o for o in objects), **kwargs)

    def _render_buffer(self, buffer) -> str:
        """Last line of defence: text that reached a segment unescaped (a ``Text`` inside a table, say)."""
        return super()._render_buffer(
            segment if segment.control or not CONTROL.search(segment.text)
            else Segment(escape_controls(segment.text), segment.style) for segment in buffer)


def columns_setting() -> int | None:
    """``COLUMNS`` as a width: None when unset, not a number, or 0; at least ``MIN_WIDTH`` otherwise."""
    raw = os.environ.get("COLUMNS", "").strip()
    if not raw.isdigit() or int(raw) == 0:
        return None
    return max(int(raw), MIN_WIDTH)


def make_console(*, stderr: bool = False) -> Console:
    console = SafeConsole(stderr=stderr, width=LOG_WIDTH)  # a width given: rich reads no COLUMNS of its own
    width = columns_setting()
    if width is None and console.is_terminal:
        width = max(shutil.get_terminal_size((LOG_WIDTH, 24)).columns or LOG_WIDTH, MIN_WIDTH)
    if width is not None:
        console.width = width
    return console
