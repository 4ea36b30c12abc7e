"""The shipped published-run CSVs are the shared originals, byte for byte (hashes in PROVENANCE.md)."""

import hashlib
import re

import pytest

from echo_tune.validate.datasets import (COLLECTED, COLLECTED_RUNS_DIR, DATASETS, PUBLISHED, PUBLISHED_RUNS_DIR,
                                         published_runs)
from echo_tune.validate.runs import read_runs


def _recorded(path=PUBLISHED_RUNS_DIR / "PROVENANCE.md") -> dict[str, str]:
    text = path.read_text()
    return dict(re.findall(r"^\| (\S+) \| ([0-9a-f]{64}) \|$", text, flags=re.M))


def test_every_shipped_file_matches_its_recorded_hash():
    recorded = _recorded()
    assert set(PUBLISHED) | {"runs.csv", "SOURCE_README.md"} == set(recorded)
    for name, digest in recorded.items():
        assert hashlib.sha256((PUBLISHED_RUNS_DIR / name).read_bytes()).hexdigest() == digest, name


def test_unknown_data_set_is_a_clear_error():
    with pytest.raises(FileNotFoundError, match="must be one of"):
        published_runs("runs_nope.csv")


def test_collected_sets_match_their_readme_and_name_their_sources():
    """A collected set is the one its README describes (its hash), and every row names a pull request and simulates."""
    recorded = _recorded(COLLECTED_RUNS_DIR / "README.md")
    assert set(COLLECTED) == set(recorded) and set(DATASETS) == set(PUBLISHED) | set(COLLECTED)
    for name in COLLECTED:
        assert hashlib.sha256(published_runs(name).read_bytes()).hexdigest() == recorded[name], name
        cases = read_runs(published_runs(name))
        assert cases and all(c.error is None for c in cases), [c.error for c in cases if c.error]
        assert all(re.search(r"pull requests; #\d+ \(2026-", c.source) for c in cases)
