"""Coverage of Megatron-LM's own functional tests: how many GPT and MoE training cases echo-tune simulates.

Every GPT / MoE training case of benchmarks/data/megatron_functional_tests/ (Megatron-LM d98e8a64ddf3;
inference and GRPO reinforcement-learning cases are out of scope and counted apart) is run as ``echo-tune simulate --megatron-args LINE
--cluster C --num-gpus N`` on the golden platform's cluster preset and the recipe's GPU count
(functional_cases.py), and classified simulated / refused / rejected / error (functional_outcome.py). A
case's outcome is that of its primary platform (H100, else A100, else GB200). Where golden values exist,
predicted step time and memory are set against the measured ones (only reported, nothing is fitted).

    python benchmarks/functional_coverage.py [--verbose] [--json] [--case NAME ...] [--no-cache]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from functional_cases import corpus_runs, load_corpus  # noqa: E402
from functional_outcome import OUTCOMES, OutcomeCache, blocking_flags, drop_flags  # noqa: E402

TOP_FLAGS = 30
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "echo-tune"
# (name, golden key, predicted key): measured vs predicted pairs
COMPARED = (("iteration time", "iteration_time_s_median", "step_time_s"),
            ("allocated after step", "mem_allocated_bytes_first", "mem_allocated_bytes"),
            ("max allocated", "mem_max_allocated_bytes_max", "mem_max_allocated_bytes"))


def coverage(names: list[str] | None = None, cache_dir: Path | None = CACHE, corpus: dict | None = None,
             drop_refused: bool = False) -> dict:
    """Run the cases (all, or ``names``) and return the per-case records, the summary and the comparisons.

    ``drop_refused``: a what-if, each line without the flags echo-tune refuses (what the simulator would
    say, and which bugs wait behind the refusals, once those flags are modelled)."""
    corpus = load_corpus() if corpus is None else corpus
    runs, left_out = corpus_runs(corpus, names)
    cache = OutcomeCache(cache_dir)
    cases = []
    for key, case_runs in runs.items():
        dropped = blocking_flags(case_runs[0].line) if drop_refused else []
        line = drop_flags(case_runs[0].line, dropped) if dropped else case_runs[0].line
        results = []
        for run in case_runs:
            primary_failed = results and results[0]["outcome"] != "simulated"
            if primary_failed:  # another platform only adds comparisons once the primary simulates
                break
            record = {"platform": run.platform, "cluster": run.cluster, "num_gpus": run.num_gpus,
                      "gpus_source": run.gpus_source, **cache.outcome(line, run.cluster, run.num_gpus)}
            record["measured"] = {k: run.golden[k] for _, k, _ in COMPARED if k in run.golden}
            results.append(record)
        cases.append({"case": key, "outcome": results[0]["outcome"], "line": line, "dropped_flags": dropped,
                      "runs": results})
    cache.save()
    commit = next(iter(corpus.values()))["source_commit"]
    return summarize(cases, left_out) | {"corpus_commit": commit, "drop_refused": drop_refused}


def summarize(cases: list[dict], left_out: dict[str, list[str]]) -> dict:
    counts = Counter(c["outcome"] for c in cases)
    refused = [c for c in cases if c["outcome"] == "refused"]
    first = Counter(c["runs"][0]["flag"] for c in refused)
    anywhere = Counter(f for c in refused for f in c["runs"][0]["blocking_flags"])
    sole = Counter(c["runs"][0]["blocking_flags"][0] for c in refused if len(c["runs"][0]["blocking_flags"]) == 1)
    reasons = {c["runs"][0]["flag"]: c["runs"][0]["reason"] for c in refused}
    rejected = Counter(c["runs"][0]["reason"] for c in cases if c["outcome"] == "rejected")
    errors = [{"case": c["case"], "reason": c["runs"][0]["reason"], "traceback": c["runs"][0]["traceback"]}
              for c in cases if c["outcome"] == "error"]
    total = len(cases)
    return {"cases_in_scope": total, "out_of_scope": {why: len(names) for why, names in left_out.items()},
            "counts": {o: counts.get(o, 0) for o in OUTCOMES},
            "coverage": counts.get("simulated", 0) / total if total else 0.0,
            "refusals_by_first_flag": [{"flag": f, "cases": n, "reason": reasons[f]} for f, n in first.most_common()],
            "refusing_flags_anywhere": _anywhere(refused, anywhere, sole),
            "rejections": [{"reason": r, "cases": n} for r, n in rejected.most_common()],
            "errors": errors, "comparison": compare(cases), "cases": cases}


def _anywhere(refused: list[dict], anywhere: Counter, sole: Counter) -> list[dict]:
    """Refusing flags by the number of refused cases that set them; ``unblocked_cumulative``: refused cases
    left with no refusing flag once this flag and all those above it are handled (modelled or harmless)."""
    handled, out = set(), []
    blockers = [set(c["runs"][0]["blocking_flags"]) for c in refused]
    for flag, n in anywhere.most_common():
        handled.add(flag)
        out.append({"flag": flag, "cases": n, "only_blocker": sole.get(flag, 0),
                    "unblocked_cumulative": sum(b <= handled for b in blockers)})
    return out


def compare(cases: list[dict]) -> dict:
    """Predicted vs measured per simulated run with golden values: rows, median / worst |error| per metric,
    and per cluster the median signed error (predicted / measured - 1: below zero, echo-tune predicts less)."""
    rows, errs, known = [], {name: [] for name, _, _ in COMPARED}, {name: [] for name, _, _ in COMPARED}
    for case in cases:
        for run in case["runs"]:
            if run["outcome"] != "simulated" or not run["measured"]:
                continue
            row = {"case": case["case"], "cluster": run["cluster"], "num_gpus": run["num_gpus"],
                   "gpus_from_recipe": not run["gpus_source"].startswith("default")}
            for name, golden_key, predicted_key in COMPARED:
                measured = run["measured"].get(golden_key)
                if measured:
                    err = run[predicted_key] / measured - 1
                    row[name] = {"measured": measured, "predicted": run[predicted_key], "error": err}
                    errs[name].append((abs(err), case["case"], run["cluster"], err))
                    if row["gpus_from_recipe"]:
                        known[name].append((abs(err), case["case"], run["cluster"], err, measured / run[predicted_key]))
            rows.append(row)
    summary = {name: {"runs": len(v), "median_abs_error": statistics.median(e for e, *_ in v),
                      "worst_abs_error": max(v)[0], "worst": f"{max(v)[1]} on {max(v)[2]}"}
               for name, v in errs.items() if v}
    # runs whose GPU count a recipe gives (a case no recipe lists runs on its set's main recipe's count, which
    # the release cases did not: their distributed optimizer shards over a DP we do not know)
    summary_known = {name: {"runs": len(v), "median_abs_error": statistics.median(e for e, *_ in v),
                            "worst_abs_error": max(v)[0], "worst": f"{max(v)[1]} on {max(v)[2]}",
                            "measured_over_predicted_p90": _quantile([r for *_, r in v], 0.9) - 1}
                     for name, v in known.items() if v}
    by_cluster = {}
    for name, v in errs.items():
        for cluster in sorted({c for _, _, c, _ in v}):
            signed = [e for _, _, c, e in v if c == cluster]
            by_cluster.setdefault(cluster, {})[name] = {"runs": len(signed),
                                                        "median_error": statistics.median(signed)}
    return {"rows": rows, "summary": summary, "summary_gpus_from_recipe": summary_known, "by_cluster": by_cluster}


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation between order statistics (numpy's default)."""
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = int(pos)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (pos - lo)


def _short(reason: str) -> str:
    """A refusal message up to its advice (the table shows why, not what to do)."""
    for cut in (" but ", "; ", ", so "):
        reason = reason.split(cut)[0]
    return " ".join(reason.split())  # several problems come one per line: one table cell


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def print_table(result: dict, verbose: bool = False, out=sys.stdout) -> None:
    def p(*lines):
        print(*lines, sep="\n", file=out)

    total = result["cases_in_scope"]
    if result.get("drop_refused"):
        p("WHAT-IF: every line simulated without the flags echo-tune refuses (not the coverage)", "")
    left_out = ", ".join(f"{n} {why}" for why, n in result["out_of_scope"].items()) or "none"
    p(f"GPT + MoE training cases: {total} (out of scope, by name: {left_out})", "",
      "| outcome | cases | share |", "|---|---:|---:|")
    for outcome, n in result["counts"].items():
        p(f"| {outcome} | {n} | {100 * n / total:.1f}% |" if total else f"| {outcome} | 0 | - |")
    p("", "Refusals by the first refusing flag (the reason is echo-tune's own message):", "",
      "| flag | cases | reason |", "|---|---:|---|")
    for r in result["refusals_by_first_flag"]:
        p(f"| `{r['flag']}` | {r['cases']} | {_short(r['reason'])} |")
    anywhere = result["refusing_flags_anywhere"]
    shown = anywhere if verbose else anywhere[:TOP_FLAGS]
    p("", f"Refusing flags anywhere in the refused cases (only blocker: cases that flag alone refuses; "
          f"unblocked: refused cases left with no refusing flag once the flags down to this row are handled)"
          f"{'' if len(shown) == len(anywhere) else f', top {len(shown)} of {len(anywhere)} (--verbose: all)'}:",
      "", "| flag | cases | only blocker | unblocked |", "|---|---:|---:|---:|")
    for r in shown:
        p(f"| `{r['flag']}` | {r['cases']} | {r['only_blocker']} | {r['unblocked_cumulative']} |")
    if result["rejections"]:
        p("", "Rejected (a rule of the model or layout):", "", "| cases | message |", "|---:|---|")
        for r in result["rejections"]:
            p(f"| {r['cases']} | {r['reason'][:160]} |")
    p("", f"Errors (tracebacks): {len(result['errors'])}")
    for e in result["errors"]:
        p(f"- {e['case']}: {e['reason']}")
    _print_comparison(result["comparison"], verbose, p)
    if verbose:
        p("", "| case | platform | GPUs | outcome | flag / reason |", "|---|---|---:|---|---|")
        for c in result["cases"]:
            r = c["runs"][0]
            why = r.get("flag") or (r.get("reason") or "")[:100]
            p(f"| {c['case']} | {r['platform']} | {r['num_gpus']} | {c['outcome']} | {why} |")


def _print_comparison(comparison: dict, verbose: bool, p) -> None:
    p("", "Predicted vs measured (golden values; memory of the last rank, which Megatron logs):", "",
      "| metric | runs | median abs error | worst abs error | worst run |", "|---|---:|---:|---:|---|")
    if not comparison["summary"]:
        p("| (no simulated run with golden values) | 0 | - | - | - |")
    for name, s in comparison["summary"].items():
        p(f"| {name} | {s['runs']} | {100 * s['median_abs_error']:.1f}% | {100 * s['worst_abs_error']:.1f}% "
          f"| {s['worst']} |")
    if comparison.get("summary_gpus_from_recipe"):
        p("", "The same over the runs whose GPU count a recipe gives (measured / predicted - 1, 90th percentile: "
              "the memory band's PEAK_UNDER_PREDICTION, sim/memory/memory_band.py):", "",
          "| metric | runs | median abs error | worst abs error | worst run | p90 measured/predicted - 1 |",
          "|---|---:|---:|---:|---|---:|")
        for name, s in comparison["summary_gpus_from_recipe"].items():
            p(f"| {name} | {s['runs']} | {100 * s['median_abs_error']:.1f}% | {100 * s['worst_abs_error']:.1f}% "
              f"| {s['worst']} | {100 * s['measured_over_predicted_p90']:+.1f}% |")
    if comparison["by_cluster"]:
        p("", "Median signed error (predicted / measured - 1) by cluster:", "",
          "| cluster | " + " | ".join(name for name, _, _ in COMPARED) + " |", "|---|" + "---:|" * len(COMPARED))
        for cluster, by in comparison["by_cluster"].items():
            p(f"| {cluster} | " + " | ".join(f"{100 * by[n]['median_error']:+.1f}% ({by[n]['runs']})" if n in by
                                             else "-" for n, _, _ in COMPARED) + " |")
    if not verbose:
        return
    p("", "| case | cluster | GPUs | time meas/pred s | alloc meas/pred GiB | max alloc meas/pred GiB |",
      "|---|---|---:|---|---|---|")
    for row in comparison["rows"]:
        cells = []
        for name, fmt in (("iteration time", lambda v: f"{v:.3f}"), ("allocated after step", _gib),
                          ("max allocated", _gib)):
            m = row.get(name)
            cells.append(f"{fmt(m['measured'])} / {fmt(m['predicted'])} ({100 * m['error']:+.0f}%)" if m else "-")
        p(f"| {row['case']} | {row['cluster']} | {row['num_gpus']} | " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="per-case rows and per-run comparisons")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--case", action="append", help="only this case (set/name or name); repeatable")
    parser.add_argument("--drop-refused", action="store_true",
                        help="what-if: simulate each line without the flags echo-tune refuses")
    parser.add_argument("--no-cache", action="store_true", help=f"simulate every line again (cache: {CACHE})")
    args = parser.parse_args(argv)
    result = coverage(args.case, cache_dir=None if args.no_cache else CACHE, drop_refused=args.drop_refused)
    if args.case and not result["cases"]:
        parser.error(f"no GPT/MoE training case is named {' or '.join(args.case)} (see the names in "
                     f"benchmarks/data/megatron_functional_tests/*.yaml)")
    if args.json:
        json.dump(result, sys.stdout, indent=1, default=str)
        print()
    else:
        print_table(result, verbose=args.verbose)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
