"""Simulated vs measured step time on the published Megatron-LM runs (the validate table).

    python benchmarks/accuracy.py [RUNS.csv]

Prints every row, the mean absolute percentage error, the worst row and the Spearman rank
correlation, overall and by source, so each change to the cost models shows its effect.
"""

from __future__ import annotations

import sys
from pathlib import Path

from echo_tune.cli.main import main
from echo_tune.validate.datasets import published_runs

DEFAULT = published_runs("runs_megatron.csv")

if __name__ == "__main__":
    raise SystemExit(main(["validate", sys.argv[1] if len(sys.argv) > 1 else str(DEFAULT)]))
