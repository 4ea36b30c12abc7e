"""The default search's rounds replayed on a stored exhaustive study: not a test, a measurement.

Every layout's step time is known from the exhaustive study that ``search_quality.py`` keeps
(``--results-dir``), so the rounds of ``auto.next_round`` can be replayed for any budget without simulating:
the gap of the best layout they reach to the optimum, per budget.

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

import optuna  # noqa: E402

from echo_tune.search.engines import auto  # noqa: E402
from echo_tune.search.space.layouts import check_space  # noqa: E402
from echo_tune.search.storage.study_storage import open_storage  # noqa: E402
from search_quality import build  # noqa: E402


def replay(valid: list, truth: dict, budget: int) -> float:
    """The best step time the rounds reach with ``budget`` layouts (inf if none fits)."""
    scores: dict = {}
    while todo := auto.next_round(valid, scores, budget):
        scores.update({c.key: truth[c.key] for c in todo})
    return min((v for v in scores.values() if v is not None), default=float("inf"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spaces", default="qwen3-30b-a3b,llama3.1-70b,gpt3-175b,mixtral-8x7b")
    parser.add_argument("--budgets", default="3000,2000,1000,500,100")
    parser.add_argument("--results-dir", required=True, help="where search_quality.py kept the exhaustive studies")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    budgets = [int(b) for b in args.budgets.split(",")]
    print("| space | structures | " + " | ".join(str(b) for b in budgets) + " |")
    print("|---|---:|" + "---:|" * len(budgets))
    for name in args.spaces.split(","):
        space = build(name)
        valid, _ = check_space(space)
        study_name = f"{space.name}-exhaustive-1"
        store = open_storage(Path(args.results_dir) / study_name)
        truth = auto.stored_scores(optuna.load_study(study_name=study_name, storage=store.storage))
        optimum = min(v for v in truth.values() if v is not None)
        gaps = [f"{100 * (replay(valid, truth, b) / optimum - 1):.2f}%" for b in budgets]
        print(f"| {name} | {len(auto.groups(valid))} | " + " | ".join(gaps) + " |")


if __name__ == "__main__":
    main()
