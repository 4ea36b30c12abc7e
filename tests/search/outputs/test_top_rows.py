"""The search table's rows (search/outputs/top_rows.py): one per layout and its VPP / recompute variants."""

from __future__ import annotations

from echo_tune.cli.search_report import result_tables
from echo_tune.search.outputs.top_rows import top_rows, variant_group


def _record(step: float, vpp=None, recompute=None, tp=1, modules=None) -> dict:
    config = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 4, "micro_batch_size": 1,
              "virtual_pipeline_model_parallel_size": vpp, "recompute_granularity": recompute,
              "recompute_method": None, "recompute_num_layers": None, "recompute_modules": modules}
    return {"config": config, "step_time_s": step}


def test_variants_of_one_layout_make_one_row_with_their_span():
    ranked = list(enumerate([_record(1.0, vpp=4), _record(1.01, vpp=2), _record(1.02, tp=2),
                             _record(1.03, vpp=2, recompute="selective", modules=["core_attn", "mlp"]),
                             _record(1.05, tp=2, vpp=3)]))
    rows = top_rows(ranked)
    assert [(r["trial"], r["variants"]) for r in rows] == [(0, 3), (2, 2)]  # each group's best, best first
    assert rows[0]["variant_span"] == "VPP 2,4; recompute none, selective:core_attn+mlp"
    assert rows[1]["variant_span"] == "VPP 1,3"
    assert top_rows(ranked[:1])[0]["variant_span"] == ""
    assert [r["trial"] for r in top_rows(ranked, n=1)] == [0]


def test_search_table_shows_each_layout_once_at_its_best_variant(small_exhaustive, small_space):
    result = small_exhaustive
    feasible = [r for r in result.records if r["fits_memory"]]
    best = {}
    for r in sorted(feasible, key=lambda r: r["step_time_s"]):
        best.setdefault(variant_group(r["config"]), r)
    groups = [variant_group(r["config"]) for r in result.top]
    assert len(set(groups)) == len(groups) == min(20, len(best))
    for row, group in zip(result.top, groups):
        assert row["step_time_s"] == best[group]["step_time_s"]
        assert row["variants"] == sum(variant_group(r["config"]) == group for r in feasible)
    assert any(r["variants"] > 1 for r in result.top)  # the small space has VPP / recompute variants
    table = result_tables(small_space, result, top=5)[0]
    assert "variants" in [c.header for c in table.columns]
