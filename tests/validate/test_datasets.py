"""The shipped published-run CSVs are the shared originals, byte for byte (hashes in PROVENANCE.md)."""

import hashlib
import re

import pytest

from echo_tune.validate.datasets import DATASETS, PUBLISHED_RUNS_DIR, published_runs


def _recorded() -> dict[str, str]:
    text = (PUBLISHED_RUNS_DIR / "PROVENANCE.md").read_text()
    return dict(re.findall(r"^\| (\S+) \| ([0-9a-f]{64}) \|$", text, flags=re.M))


def test_every_shipped_file_matches_its_recorded_hash():
    recorded = _recorded()
    assert set(DATASETS) | {"runs.csv", "SOURCE_README.md"} == set(recorded)
    for name, digest in recorded.items():
        assert hashlib.sha256((PUBLISHED_RUNS_DIR / name).read_bytes()).hexdigest() == digest, name


def test_unknown_data_set_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="must be one of"):
        published_runs("runs_nope.csv")
