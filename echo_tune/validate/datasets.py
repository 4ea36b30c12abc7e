"""The published-run data sets shipped with echo-tune (``calibration/published-runs/``).

Copied unchanged from the project's shared data, with their SHA-256 in ``PROVENANCE.md`` there; each row
names its public source. ``echo-tune validate``, ``benchmarks/accuracy.py`` and the accuracy tests read
them from here, so they run in a fresh clone with nothing beside it.
"""

from __future__ import annotations

from pathlib import Path
import hashlib

PUBLISHED_RUNS_DIR = Path(__file__).resolve().parents[2] / "calibration" / "published-runs"
"""Where the shipped CSVs live (a source checkout; ``echo-tune validate`` takes any path)."""

DATASETS = ("runs_megatron.csv", "runs_modern.csv", "runs_bridge.csv", "runs_bridge_2025.csv")
"""The validation sets in ``echo-tune validate``'s format (``runs.csv`` is the raw source table)."""


def published_runs(name: str) -> Path:
    """Path of a shipped data set (``runs_megatron.csv``, ``runs_modern.csv``, ``runs_bridge.csv``,
    ``runs_bridge_2025.csv``, ``runs.csv``)."""
    path = PUBLISHED_RUNS_DIR / name
    if not path.is_file():
        known = ", ".join(DATASETS + ("runs.csv",))
        raise FileNotFoundError(f"published-runs data set {name!r} must be one of {known}, but "
                                f"{str(path)!r} is missing; restore calibration/published-runs/ from git")
    return path


def is_published(path: str | Path) -> bool:
    """Whether a runs CSV is one of the shipped published-run sets, byte for byte."""
    def digest(p) -> str:
        return hashlib.sha256(Path(p).read_bytes()).hexdigest()

    mine = digest(path)
    return any(digest(p) == mine for p in PUBLISHED_RUNS_DIR.glob("runs_*.csv"))
