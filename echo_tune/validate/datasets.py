"""The measured-run data sets shipped with echo-tune: the developers' sets.

- ``calibration/published-runs/``: copied unchanged from the project's shared data, with their SHA-256 in
  ``PROVENANCE.md`` there (``PUBLISHED``);
- ``calibration/collected-runs/``: runs echo-tune's developers wrote down from public sources the shared data
  does not hold, each row with its source and the README there saying how (``COLLECTED``).

Each row names its public source. ``echo-tune validate``, ``benchmarks/accuracy.py``, the fits, the error bands and
the accuracy tests read them from here, so they run in a fresh clone with nothing beside it.
"""

from __future__ import annotations

from pathlib import Path
import hashlib

PUBLISHED_RUNS_DIR = Path(__file__).resolve().parents[2] / "calibration" / "published-runs"
"""Where the shipped CSVs live (a source checkout; ``echo-tune validate`` takes any path)."""

COLLECTED_RUNS_DIR = PUBLISHED_RUNS_DIR.parent / "collected-runs"
"""Where the collected CSVs live (their README says what each holds and where it was read)."""

PUBLISHED = ("runs_megatron.csv", "runs_modern.csv", "runs_bridge.csv", "runs_bridge_2025.csv")
"""The shared data's validation sets in ``echo-tune validate``'s format (``runs.csv`` is the raw source table)."""
COLLECTED = ("runs_bridge_prs.csv",)
"""Collected sets: Qwen3-30B-A3B layouts measured on 16 H100 in Megatron-Bridge pull requests (2026)."""
DATASETS = PUBLISHED + COLLECTED
"""The developers' sets: every fit, band and accuracy page reads these."""


def published_runs(name: str) -> Path:
    """Path of a shipped data set (one of ``DATASETS``, or ``runs.csv``)."""
    folder = COLLECTED_RUNS_DIR if name in COLLECTED else PUBLISHED_RUNS_DIR
    path = folder / name
    if name not in DATASETS + ("runs.csv",) or not path.is_file():
        known = ", ".join(DATASETS + ("runs.csv",))
        raise FileNotFoundError(f"published-runs data set {name!r} must be one of {known}, but "
                                f"{str(path)!r} is missing; restore {folder.parent.name}/{folder.name}/ from git")
    return path


def dataset_paths() -> list[Path]:
    """The developers' sets, in ``DATASETS`` order."""
    return [published_runs(name) for name in DATASETS]


def is_published(path: str | Path) -> bool:
    """Whether a runs CSV is one of the shipped published-run sets, byte for byte."""
    def digest(p) -> str:
        return hashlib.sha256(Path(p).read_bytes()).hexdigest()

    mine = digest(path)
    return any(digest(p) == mine for folder in (PUBLISHED_RUNS_DIR, COLLECTED_RUNS_DIR)
               for p in folder.glob("runs_*.csv"))
