"""What computed a result: echo-tune's version and a digest of its sources.

Stored with what outlives a run: the error bands (``plan/error_bands.json``), a plan study's name, and a search
study's ``content`` (``search/storage/content.py``), so that a result of other code is never mixed with or taken for
one of this code.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
import echo_tune

DIGEST_EXCLUDES = ("error_bands.json",)
"""Files left out of the digest: the error-band table stores the digest itself (``plan/bands.py``)."""


def code_version() -> dict:
    """echo-tune's version and a SHA-256 over its package sources and data (Python, YAML, JSON; the error-band
    table excepted), in path order."""
    return {"version": getattr(echo_tune, "__version__", "unknown"), "sources_sha256": sources_sha256()}


@functools.lru_cache(maxsize=1)
def sources_sha256() -> str:
    """Read once per process (a plan asks once per candidate; ~0.03 s)."""
    root = Path(echo_tune.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".yaml", ".yml", ".json")
                    and p.name not in DIGEST_EXCLUDES and "__pycache__" not in p.parts):
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()
