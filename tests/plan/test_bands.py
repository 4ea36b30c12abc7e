"""Error bands: a prediction carries its validated family's error, the nearest one, or says it is outside."""

import dataclasses
from pathlib import Path

import pytest

from echo_tune.validate.datasets import published_runs
import echo_tune as et
from echo_tune.cost.profile import default_profile
from echo_tune.plan.bands import (band_for, band_or_none, band_summary, band_text, build_bands, family_key,
                                  inputs_sha256, load_bands, measured_ratio_range, median_ratio, scale_of)

REPO = Path(__file__).resolve().parents[2]
def _fam(gpu, kind, precision, scale, n, lo, hi, median, runs=None):
    """A family whose runs erred ``runs`` (lowest, highest; default: its band's ends)."""
    low, high = runs or (lo, hi)
    return {"gpu": gpu, "kind": kind, "precision": precision, "scale": scale, "n_runs": n, "mean_abs_error_pct": 9.0,
            "mean_signed_error_pct": median, "median_signed_error_pct": median, "band_lo_pct": lo, "band_hi_pct": hi,
            "min_signed_error_pct": low, "max_signed_error_pct": high}


BANDS = {"families": {
    "h100-sxm/dense/bf16/<=64": _fam("h100-sxm", "dense", "bf16", "<=64", 3, -15.0, 5.0, -5.0),
    "h100-sxm/moe/bf16/<=64": _fam("h100-sxm", "moe", "bf16", "<=64", 2, -9.0, -3.0, -6.0),
    "a100-80gb/dense/bf16/>512": _fam("a100-80gb", "dense", "bf16", ">512", 9, -2.0, 4.0, 1.0)},
    "all": {"n_runs": 14, "mean_abs_error_pct": 4.0, "mean_signed_error_pct": 0.0, "median_signed_error_pct": -1.0,
            "band_lo_pct": -20.0, "band_hi_pct": 15.0}}


def test_scales():
    assert [scale_of(n) for n in (8, 64, 65, 512, 513)] == ["<=64", "<=64", "<=512", "<=512", ">512"]


def test_exact_pooled_and_unvalidated():
    exact = band_for("h100-sxm", "dense", False, 32, BANDS)
    assert exact["match"] == "exact" and exact["band_lo_pct"] == -15.0
    # another scale of the same GPU and kind: not the <=64 family's band alone, the GPU and kind's runs together
    other_scale = band_for("h100-sxm", "dense", False, 1024, BANDS)
    assert other_scale["match"] == "unvalidated"  # this table has no pooled runs
    pooled = {**BANDS, "pooled": {"h100-sxm/dense/all": _fam("h100-sxm", "dense", "all", "all", 5, -18.0, 9.0, -4.0)}}
    other_scale = band_for("h100-sxm", "dense", False, 1024, pooled)
    assert other_scale["match"] == "pooled" and other_scale["family"] == "h100-sxm/dense/all"
    assert other_scale["band_lo_pct"] == -18.0 and "no validated run of h100-sxm/dense/bf16/>512" in other_scale["note"]
    # no band is borrowed from another GPU, even of the same architecture
    for gpu in ("h200-sxm", "b200"):
        other = band_for(gpu, "dense", False, 1024, BANDS)
        assert other["match"] == "unvalidated" and f"no validated dense run on {gpu}" in other["note"]
        assert (other["band_lo_pct"], other["band_hi_pct"]) == (-20.0, 15.0)
    # a family of fewer than 3 runs is unvalidated: the band of all runs, never its own narrow one
    moe = band_for("h100-sxm", "moe", False, 64, BANDS)
    assert moe["match"] == "unvalidated" and "only 2 validated MoE run(s) on h100-sxm" in moe["note"]
    assert band_text(moe) == "unvalidated: all runs -1% (-20..+15%, n=14)"


def test_runs_of_one_gpu_and_kind_are_pooled_before_unvalidated():
    # two h100 MoE families of 2 runs each: neither is a band, their 4 runs together are
    pooled = {**BANDS, "families": {**BANDS["families"],
                                    "h100-sxm/moe/fp8/<=512": _fam("h100-sxm", "moe", "fp8", "<=512", 2, -8.0, 9.0, 1.0)},
              "pooled": {"h100-sxm/moe/all": {**_fam("h100-sxm", "moe", "all", "all", 4, -12.0, 10.0, -2.0)}}}
    band = band_for("h100-sxm", "moe", False, 64, pooled)
    assert band["match"] == "pooled" and band["family"] == "h100-sxm/moe/all" and band["band_lo_pct"] == -12.0
    assert "2 validated run(s) of h100-sxm/moe/bf16/<=64" in band["note"] and "every precision and scale" in band["note"]
    # a pool of fewer than 3 runs is no band either
    few = {**pooled, "pooled": {"h100-sxm/moe/all": {**pooled["pooled"]["h100-sxm/moe/all"], "n_runs": 2}}}
    assert band_for("h100-sxm", "moe", False, 64, few)["match"] == "unvalidated"


def test_a_pooled_band_covers_the_predictions_own_family_runs():
    # the H100 fine-grained MoE FP8 family's two runs erred +14% and +116%; the pool of six trimmed +116% as its
    # outlier and says -12..+11%: the prediction's nearest runs are never trimmed away
    own = _fam("h100-sxm", "moe", "fp8", "<=64", 2, 19.0, 111.0, 65.0, runs=(14.0, 116.0))
    table = {**BANDS, "families": {**BANDS["families"], "h100-sxm/moe/fp8/<=64": own},
             "pooled": {"h100-sxm/moe/all": _fam("h100-sxm", "moe", "all", "all", 6, -12.0, 11.0, -2.0)}}
    band = band_for("h100-sxm", "moe", True, 16, table)
    assert band["match"] == "pooled" and (band["band_lo_pct"], band["band_hi_pct"]) == (-12.0, 116.0)
    assert "2 validated run(s) of h100-sxm/moe/fp8/<=64;" in band["note"]
    assert band["note"].endswith("widened to cover its own family's runs (+14..+116%)")
    assert band_text(band) == "-2% (-12..+116%, n=6)"
    # runs inside the pool's band leave it as it is
    inside = {**table, "families": {**table["families"],
                                    "h100-sxm/moe/fp8/<=64": {**own, "min_signed_error_pct": -5.0,
                                                              "max_signed_error_pct": 4.0}}}
    band = band_for("h100-sxm", "moe", True, 16, inside)
    assert (band["band_lo_pct"], band["band_hi_pct"]) == (-12.0, 11.0) and "widened" not in band["note"]


def test_a_band_covers_the_gpu_side_error_of_its_runs_at_the_predictions_host_share():
    # three runs agree within -12..+11% with the fitted host time, but their GPU side alone erred down to -65%:
    # a layout whose step the host carries none of gets that low end; one as host-bound as the runs keeps the band
    fam = {**_fam("h100-sxm", "moe", "fp8", "<=64", 3, -12.0, 11.0, -2.0), "gpu_side_min_signed_error_pct": -65.0}
    table = {**BANDS, "families": {**BANDS["families"], "h100-sxm/moe/fp8/<=64": fam}}
    gpu_bound = band_for("h100-sxm", "moe", True, 16, table, host_share=0.0)
    assert gpu_bound["match"] == "exact" and gpu_bound["band_lo_pct"] == pytest.approx(-65.0)
    assert "carries 0% of this step" in gpu_bound["note"] and "erred down to -65%" in gpu_bound["note"]
    half = band_for("h100-sxm", "moe", True, 16, table, host_share=0.5)  # (1 - 0.65) / 0.5 - 1 = -30%
    assert half["band_lo_pct"] == pytest.approx(-30.0)
    like_the_runs = band_for("h100-sxm", "moe", True, 16, table, host_share=0.62)
    assert like_the_runs["band_lo_pct"] == -12.0 and "host time" not in like_the_runs["note"]
    assert band_for("h100-sxm", "moe", True, 16, table)["band_lo_pct"] == -12.0  # no share given: the band alone
    # a widening of a few points is made but not narrated
    close = {**table, "families": {"h100-sxm/moe/fp8/<=64": {**fam, "gpu_side_min_signed_error_pct": -15.0}}}
    quiet = band_for("h100-sxm", "moe", True, 16, close, host_share=0.0)
    assert quiet["band_lo_pct"] == pytest.approx(-15.0) and "host time" not in quiet["note"]
    assert not band_summary(quiet)["widened_for_host_share"] and band_summary(gpu_bound)["widened_for_host_share"]
    # a family without GPU-side errors (an older table) is left as it is
    plain = {**BANDS, "families": {**BANDS["families"], "h100-sxm/moe/fp8/<=64": _fam("h100-sxm", "moe", "fp8",
                                                                                       "<=64", 3, -12.0, 11.0, -2.0)}}
    assert band_for("h100-sxm", "moe", True, 16, plain, host_share=0.0)["band_lo_pct"] == -12.0


def test_a_pooled_band_takes_the_gpu_side_error_of_the_pool():
    # a BF16 layout of a model whose host-bound runs are FP8: its own family (one GPT-OSS run) is not the band, the
    # pool is, and the pool's GPU side erred down to -65%
    own = {**_fam("h100-sxm", "moe", "bf16", "<=64", 1, -17.0, -7.0, -12.0), "gpu_side_min_signed_error_pct": -35.0}
    pool = {**_fam("h100-sxm", "moe", "all", "all", 6, -12.0, 11.0, -2.0), "gpu_side_min_signed_error_pct": -65.0}
    table = {**BANDS, "families": {"h100-sxm/moe/bf16/<=64": own}, "pooled": {"h100-sxm/moe/all": pool}}
    band = band_for("h100-sxm", "moe", False, 16, table, host_share=0.0)
    assert band["match"] == "pooled" and band["band_lo_pct"] == pytest.approx(-65.0)
    assert "the GPU side alone of the runs of h100-sxm/moe/all erred down to -65%" in band["note"]


def test_the_gpu_side_floor_comes_from_runs_as_gpu_bound_as_the_prediction_where_there_are_enough():
    # the pool of the test above, its runs' (host share, GPU-side error) kept: two host-bound FP8 runs erred -65 / -60%
    # with the host time at 0; three runs at host share 0 erred -8 / -12 / -21% (measured at 0 host share)
    pairs = [[0.0, -8.0], [0.0, -12.0], [0.05, -21.0], [0.39, -65.0], [0.62, -60.0]]
    own = {**_fam("h100-sxm", "moe", "fp8", "<=64", 2, -5.0, 104.0, 50.0), "gpu_side_min_signed_error_pct": -65.0}
    pool = {**_fam("h100-sxm", "moe", "all", "all", 5, -21.0, 104.0, -8.0), "gpu_side_min_signed_error_pct": -65.0,
            "gpu_side_by_host_share": pairs}
    table = {**BANDS, "families": {"h100-sxm/moe/fp8/<=64": own}, "pooled": {"h100-sxm/moe/all": pool}}
    gpu_bound = band_for("h100-sxm", "moe", True, 16, table, host_share=0.0)
    assert gpu_bound["band_lo_pct"] == pytest.approx(-21.0) and not gpu_bound.get("gpu_side_widened")
    # as host-bound as the first FP8 run: every run at most that host-bound is in its regime, the floor is theirs
    mid = band_for("h100-sxm", "moe", True, 16, table, host_share=0.35)  # shares <= 45%: -65% at 35% -> -46%
    assert mid["band_lo_pct"] == pytest.approx(100 * (0.35 / 0.65 - 1))
    assert "its 4 runs at most as host-bound (host share <= 45%) of h100-sxm/moe/all erred down to -65%" in mid["note"]
    # fewer than MIN_RUNS runs in the prediction's regime: every run's floor (the conservative reading)
    few = {**table, "pooled": {"h100-sxm/moe/all": {**pool, "gpu_side_by_host_share": pairs[2:]}}}
    fallback = band_for("h100-sxm", "moe", True, 16, few, host_share=0.0)
    assert fallback["band_lo_pct"] == pytest.approx(-65.0)
    assert "the GPU side alone of the runs of h100-sxm/moe/all erred down to -65%" in fallback["note"]


def test_a_family_without_enough_runs_like_the_prediction_takes_its_gpu_and_kinds():
    # an exact family of three host-bound runs (GPU side alone -59%) and its GPU and kind's pool with three runs at
    # host share 0 (-6, -11, -34%): a GPU-bound prediction answers to the pool's, named as such
    own = {**_fam("b200", "moe", "fp8", "<=64", 3, -10.0, 7.0, 1.0), "gpu_side_min_signed_error_pct": -59.0,
           "gpu_side_by_host_share": [[0.5, -50.0], [0.6, -59.0], [0.6, -57.0]]}
    pool = {**_fam("b200", "moe", "all", "all", 6, -30.0, 20.0, -3.0), "gpu_side_min_signed_error_pct": -59.0,
            "gpu_side_by_host_share": [[0.0, -6.0], [0.0, -11.0], [0.05, -34.0], [0.5, -50.0], [0.6, -59.0],
                                       [0.6, -57.0]]}
    table = {**BANDS, "families": {"b200/moe/fp8/<=64": own}, "pooled": {"b200/moe/all": pool}}
    band = band_for("b200", "moe", True, 8, table, host_share=0.0)
    assert band["match"] == "exact" and band["band_lo_pct"] == pytest.approx(-34.0)
    assert "its 3 runs at most as host-bound (host share <= 10%) of b200/moe/all erred down to -34%" in band["note"]
    # without the pool's runs at hand: the family's own, every run (-59%)
    alone = band_for("b200", "moe", True, 8, {**table, "pooled": {}}, host_share=0.0)
    assert alone["band_lo_pct"] == pytest.approx(-59.0) and "the runs of b200/moe/fp8/<=64" in alone["note"]


def test_shipped_bands_keep_each_runs_host_share_beside_its_gpu_side_error():
    pool = load_bands()["pooled"]["h100-sxm/moe/all"]
    pairs = pool["gpu_side_by_host_share"]
    assert len(pairs) == pool["n_runs"]
    assert min(g for _, g in pairs) == pytest.approx(pool["gpu_side_min_signed_error_pct"], abs=1e-3)
    # the 2025-26 tables' Qwen3-30B-A3B rows (FP8, 16 local experts, MBS 1 and 2), GPT-OSS and the three EP-overlap
    # layouts (their layer pairs issue the router's and the dispatcher's metadata kernels from Python) lean on the
    # host time; the other BF16 layouts of the same job on 16 H100 and Grok-1 barely do
    assert max(h for h, _ in pairs) > 0.4 and sum(h > 0.1 for h, _ in pairs) == 6
    assert sum(h < 0.1 for h, _ in pairs) >= 7


def test_band_text_and_ratios_share_one_sign_convention():
    # every run of a family predicted too fast (prediction errors -15.5 .. -5.7%): measured took 6..18% longer
    biased = {"n_runs": 5, "mean_abs_error_pct": 11.0, "mean_signed_error_pct": -11.0, "median_signed_error_pct": -9.0,
              "band_lo_pct": -15.5, "band_hi_pct": -5.7}
    lo, hi = measured_ratio_range(biased)
    assert lo == pytest.approx(1 / 0.943) and hi == pytest.approx(1 / 0.845) and lo > 1
    assert band_text(biased) == "-9% (-16..-6%, n=5)"
    summary = band_summary({**biased, "family": "f", "match": "exact", "note": "n"})
    assert summary["text"] == "-9% (-16..-6%, n=5)" and summary["measured_over_predicted"] == [lo, hi]
    assert summary["prediction_error_pct"] == [-15.5, -5.7] and summary["validated"]
    assert summary["median_measured_over_predicted"] == pytest.approx(1 / 0.91)


def test_no_band_has_zero_width_and_one_outlier_does_not_set_it():
    from echo_tune.plan.bands import _summary

    one_value = _summary([3.0, 3.0, 3.0], min_half_width=4.0)
    assert (one_value["band_lo_pct"], one_value["band_hi_pct"]) == (-1.0, 7.0)
    # five runs, one +33% outlier (like Megatron-LM README row44): the band spans the other four only
    spread = _summary([-2.0, 0.0, 1.0, 2.0, 33.0], min_half_width=1.0)
    assert spread["band_hi_pct"] < 2.0 + 1e-9 and spread["max_signed_error_pct"] == 33.0
    for fam in load_bands()["families"].values():
        assert fam["band_hi_pct"] - fam["band_lo_pct"] >= 2 * load_bands()["min_half_width_pct"] - 1e-9


def test_host_fitted_rows_count_out_of_sample():
    """The H100 rows the default host time was fitted on enter the bands with their leave-one-source-out error."""
    from echo_tune.cost.host.host_time import shipped_fit
    from echo_tune.validate.held_out import out_of_sample_errors

    row = next(r for r in shipped_fit()["rows"] if r["name"] == "mb2511-qwen3-30b-a3b-fp8cs-16xh100")

    class Case:
        name, source = row["name"], row["source"]

    class Result:
        error_pct = 0.0

    assert out_of_sample_errors([(Case, Result)]) == [row["loso_error_pct"]]
    Case.name = "not fitted"
    assert out_of_sample_errors([(Case, Result)]) == [0.0]


def test_shipped_table_is_consistent_and_names_its_command():
    bands = load_bands()
    assert bands["command"].startswith("python -m echo_tune.plan.bands")
    from echo_tune.validate.datasets import DATASETS
    assert bands["sources"] == list(DATASETS)  # every developers' set, the collected ones included
    assert sum(f["n_runs"] for f in bands["families"].values()) == bands["all"]["n_runs"] > 0
    for key, fam in bands["families"].items():
        assert key == family_key(fam) and fam["mean_abs_error_pct"] >= abs(fam["mean_signed_error_pct"]) - 1e-9
        assert fam["min_signed_error_pct"] <= fam["mean_signed_error_pct"] <= fam["max_signed_error_pct"]
        assert fam["band_lo_pct"] < fam["median_signed_error_pct"] < fam["band_hi_pct"]


def test_build_from_a_runs_csv_groups_rows_by_family():
    csv = published_runs("runs_megatron.csv")
    bands = build_bands([str(csv)])
    assert bands["all"]["n_runs"] >= 10
    assert all(k.startswith(("a100", "h100", "h800", "h200", "b200", "gb200")) for k in bands["families"])


def test_median_of_the_family_is_its_middle_run():
    rows = build_bands([str(published_runs("runs_megatron.csv"))])
    for fam in rows["families"].values():
        assert fam["min_signed_error_pct"] <= fam["median_signed_error_pct"] <= fam["max_signed_error_pct"]
    # the median's measured/predicted ratio: -5% is 1 / 0.95
    assert median_ratio({"median_signed_error_pct": -5.0}) == pytest.approx(1 / 0.95)


def test_shipped_table_is_what_its_command_rebuilds_from_the_shipped_runs():
    """error_bands.json names its inputs (SHA-256 of each CSV and its errata) and the code it came from;
    rebuilt here from the same files, every family's numbers agree. After a change to the simulator or the runs,
    rerun the table's ``command`` (from the repository root)."""
    shipped = load_bands()
    paths = [str(published_runs(name)) for name in shipped["sources"]]
    assert shipped["inputs_sha256"] == inputs_sha256(paths), "inputs changed: rerun " + shipped["command"]
    assert shipped["code"]["version"] and len(shipped["code"]["sources_sha256"]) == 64
    rebuilt = build_bands(paths)
    assert set(rebuilt["families"]) == set(shipped["families"]), "rerun " + shipped["command"]
    for key, fam in rebuilt["families"].items():
        for field, value in fam.items():
            assert shipped["families"][key][field] == (pytest.approx(value, rel=1e-9, abs=1e-9)
                                                       if isinstance(value, float) else value), \
                f"{key} {field}: rerun {shipped['command']}"


def test_a_band_only_where_it_was_validated():
    h100 = et.load_cluster("h100-sxm")
    datasheet = band_or_none(default_profile(h100), h100, "dense", False, 8)
    assert datasheet["match"] == "exact" and datasheet["measured_over_predicted"]
    fitted = dataclasses.replace(default_profile(h100), name="fit", measured=True, gemm_max_efficiency=0.7)
    none = band_or_none(fitted, h100, "dense", False, 8)
    assert none["match"] == "none" and none["text"] == "-" and "'fit'" in none["note"]
    cpu = et.load_cluster(str(REPO / "tests" / "data" / "cpu-cluster.yaml"))
    assert band_or_none(default_profile(cpu), cpu, "dense", False, 1)["match"] == "none"
    # the host share (a second simulation) is computed only where a band applies
    calls = []
    share = lambda: calls.append(1) or 0.0  # noqa: E731
    assert band_or_none(fitted, h100, "dense", False, 8, host_share=share)["match"] == "none" and not calls
    assert band_or_none(default_profile(h100), h100, "dense", False, 8, host_share=share)["match"] == "exact"
    assert calls == [1]


def test_every_gpu_preset_gets_a_band_and_racks_have_their_own_runs():
    from echo_tune.config.load.loading import preset_names

    clusters = [et.load_cluster(name) for name in preset_names("clusters")]
    assert {c.gpu.name for c in clusters} == set(preset_names("gpus"))  # each GPU preset has a cluster preset
    for c in clusters:  # a GPU preset is one the bands speak for: a band of its own, a nearer one, or all runs'
        assert band_or_none(default_profile(c), c, "dense", False, 8)["match"] in ("exact", "pooled", "unvalidated")
    cluster = et.load_cluster("gb200-nvl72")
    band = band_or_none(default_profile(cluster), cluster, "dense", True, 64)
    assert band["match"] == "exact" and band["family"] == "gb200/dense/fp8/<=64"
    h200 = et.load_cluster("h200-sxm")  # no validated H200 run: unvalidated, not the H100 band
    assert band_or_none(default_profile(h200), h200, "dense", False, 64)["match"] == "unvalidated"


def test_coarse_and_fine_grained_moe_are_families_apart():
    # Grok-1 (8 experts) runs on H100 predicted -6..-12% must not vouch for a 128-expert model on H100, whose published
    # rows miss by tens of percent: the kind of a model with more than 8 experts is "moe", with at most 8 "moe-coarse"
    from echo_tune.plan.bands import kind_of

    assert kind_of(et.load_model("qwen3-30b-a3b")) == "moe" and kind_of(et.load_model("mixtral-8x7b")) == "moe-coarse"
    assert kind_of(et.load_model("llama3-8b")) == "dense"
    shipped = load_bands()
    coarse = [f for f in shipped["families"].values() if f["kind"] == "moe-coarse"]
    assert coarse and {f["gpu"] for f in coarse} == {"h100-sxm"}  # the Grok-1 rows of runs_modern.csv
    h100 = et.load_cluster("h100-sxm")
    fine = band_or_none(default_profile(h100), h100, "moe", "bf16", 16)
    assert fine["family"] != "h100-sxm/moe-coarse/bf16/<=64" and "moe-coarse" not in (fine["family"] or "")
    grok = band_or_none(default_profile(h100), h100, "moe-coarse", "bf16", 8)
    assert grok["match"] in ("exact", "pooled") and grok["family"].startswith("h100-sxm/moe-coarse/")
    with pytest.raises(ValueError, match="`kind` must be one of"):
        band_for("h100-sxm", True, False, 8, shipped)
