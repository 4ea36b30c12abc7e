"""The rich console every table is printed on.

On a terminal rich fits tables to its width; without one (a batch job's log, a pipe) it assumes 80
columns and squeezes wide tables until whole columns vanish. Off a terminal we print 160 columns wide, so
a log holds every column, unless ``COLUMNS`` sets the width (``COLUMNS=80 echo-tune plan ... | less``).
"""

from __future__ import annotations

import os

from rich.console import Console

LOG_WIDTH = 160


def make_console(*, stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    if console.is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return console
    return Console(stderr=stderr, width=LOG_WIDTH)
