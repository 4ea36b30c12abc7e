"""benchmarks/ is a folder of scripts, not a package: its modules are imported from there."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
