"""Python's cyclic garbage collector paused while a search builds and stores its long-lived objects.

An exhaustive search holds every layout of its space (43,194 on Qwen3-30B-A3B / 256 H100), and Optuna's
storage every finished trial, for the whole run: hundreds of thousands of objects that live to the end. A
full collection scans all of them (up to ~1 s each there, several per run), finds nearly nothing to free
(peak memory of that run 916 MB with the collector, 919 MB without) and, in the parent of a parallel
search, leaves the workers without batches while it runs. Reference counting still frees everything that
is not in a cycle; the collector is enabled again when the block ends. Measured in docs/search.md.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block (re-enabled after it, if it was on)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
