"""The default search's rounds replayed on a stored exhaustive study: not a test, a measurement.

Every layout's step time is known from the exhaustive study that ``search_quality.py`` keeps
(``--results-dir``), so the rounds of ``auto.search_rounds`` (the first level and, in a space with recipe features,
the feature level) can be replayed for any budget without simulating: the gap of the best layout they reach to the
optimum, per budget. A layout the exhaustive run did not simulate because the same layout without recompute fits
(search/space/dominance.py) is given that layout's time, a lower bound of its own; the search would have simulated
or skipped it, with the same best either way unless the bound decides a structure's rank.

    python benchmarks/search_quality.py --spaces deepseek-v3 --results-dir DIR     # once: the exhaustive study
    python benchmarks/search_replay.py --spaces deepseek-v3 --results-dir DIR [--budgets 3000,2000,1000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from echo_tune.search.engines import auto  # noqa: E402
from echo_tune.search.engines.feature_variants import core_space, has_features  # noqa: E402
from echo_tune.search.space.labels import full_label  # noqa: E402
from echo_tune.search.space.space_check import check_space  # noqa: E402
from search_quality import build  # noqa: E402
from stored_study import exhaustive_journal, read_study  # noqa: E402


def replay(space, valid: list, truth: dict, budget: int) -> tuple[float, dict]:
    """The best step time the rounds reach with ``budget`` layouts (inf if none fits) and the scores they saw."""
    known: dict = {}

    def simulate(todo: list) -> bool:
        for c in todo:
            known[c.key] = truth.get(hash(c.key))  # not stored: a layout the exhaustive space lacks (counted, unfit)
        return bool(todo)
    auto.search_rounds(space, valid, budget, lambda: dict(known), simulate)
    return min((v for v in known.values() if v is not None), default=float("inf")), known


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spaces", default="llama3.1-70b,gpt3-175b,mixtral-8x7b,qwen3-30b-a3b-16-recipes")
    parser.add_argument("--budgets", default="3000,2000,1000,500,100")
    parser.add_argument("--results-dir", required=True, help="where search_quality.py kept the exhaustive studies")
    parser.add_argument("--show-best", action="store_true", help="also print the best layout reached per budget")
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    print("| space | structures | " + " | ".join(str(b) for b in budgets) + " |")
    print("|---|---:|" + "---:|" * len(budgets))
    for name in args.spaces.split(","):
        space = build(name)
        valid, _ = check_space(core_space(space) if has_features(space) else space)
        stored = read_study(exhaustive_journal(Path(args.results_dir), space.name), truth=True)
        truth, optimum = stored.truth, stored.optimum_s
        gaps = []
        for b in budgets:
            best, known = replay(space, valid, truth, b)
            gaps.append(f"{100 * (best / optimum - 1):.2f}%")
            if args.show_best:
                key = min((v, i, k) for i, (k, v) in enumerate(known.items()) if v is not None)[2]
                missing = sum(hash(k) not in truth for k in known)
                print(f"# {name} {b}: {best:.4f} s ({len(known)} layouts, {missing} not in the study) {full_label(dict(key))}",
                      file=sys.stderr)
        print(f"| {name} | {len(auto.groups(valid))} | " + " | ".join(gaps) + " |")


if __name__ == "__main__":
    main()
