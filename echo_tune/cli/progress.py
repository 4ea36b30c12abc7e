"""Plain progress lines for logs (batch jobs, pipes): what rich's bar shows on a terminal, one line at a time."""

from __future__ import annotations

import sys
import time

from echo_tune.cli.common import human_time


class PlainProgress:
    """``update(done, total, best_s)`` writes ``LABEL: done/total trials, best X`` on stderr at each tenth of the
    total (or every ``every_s`` seconds when the total is unknown), and at the end."""

    def __init__(self, label: str, *, every_s: float = 10.0, stream=None):
        self.label, self.every_s, self.stream = label, every_s, stream or sys.stderr
        self._tenth, self._last = -1, 0.0
        self.fresh = True

    def start(self, what: str) -> None:
        self.fresh = False
        self.stream.write(f"{self.label}: {what}\n")
        self.stream.flush()

    def update(self, done: int, total: int | None, best_s: float | None) -> None:
        now = time.monotonic()
        if total:
            tenth = done * 10 // total
            if tenth == self._tenth and done != total:
                return
            self._tenth = tenth
        elif now - self._last < self.every_s:
            return
        self._last = now
        best = human_time(best_s) if best_s is not None else "none fits yet"
        self.stream.write(f"{self.label}: {done}/{total if total else '?'} trials, best step {best}\n")
        self.stream.flush()


class _StopRequest:
    """SIGTERM, handled like Ctrl-C but never inside a write: while a search is between its first and last
    trial (``deferred``), the signal only sets ``requested`` and the search's progress callback raises
    KeyboardInterrupt after the trial or batch in hand is stored; otherwise it interrupts at once."""

    def __init__(self) -> None:
        self.deferred = False
        self.requested = False

    def check(self) -> None:
        """Called from progress callbacks (a safe point): stop now if SIGTERM arrived."""
        self.deferred = True
        if self.requested:
            self.requested, self.deferred = False, False
            raise KeyboardInterrupt


STOP = _StopRequest()
