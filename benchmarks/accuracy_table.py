"""docs/accuracy.md and the README's accuracy table, from the current code (echo_tune/validate/accuracy_page.py).

    python benchmarks/accuracy_table.py            # print the README table (out of sample, per GPU and dense / MoE)
    python benchmarks/accuracy_table.py --write    # rewrite docs/accuracy.md and the README's table

Simulates every row of the developers' sets (calibration/published-runs/ and collected-runs/, errata applied, default
profiles). tests/validate/test_accuracy_page.py fails when the committed page is not what this writes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from echo_tune.validate.accuracy_page import collect_rows, readme_table, write

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/accuracy.md and the README's table")
    args = parser.parse_args()
    if args.write:
        write(REPO)
        print(f"wrote {REPO / 'docs' / 'accuracy.md'} and the README's table")
        return
    rows, _ = collect_rows()
    print("\n".join(readme_table(rows)))


if __name__ == "__main__":
    main()
