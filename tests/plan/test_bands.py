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
BANDS = {"families": {
    "h100-sxm/dense/bf16/<=64": {"gpu": "h100-sxm", "kind": "dense", "precision": "bf16", "scale": "<=64",
                                 "n_runs": 3, "mean_abs_error_pct": 10.0, "mean_signed_error_pct": -5.0},
    "a100-80gb/dense/bf16/>512": {"gpu": "a100-80gb", "kind": "dense", "precision": "bf16", "scale": ">512",
                                  "n_runs": 9, "mean_abs_error_pct": 2.0, "mean_signed_error_pct": 1.0}},
    "all": {"n_runs": 12, "mean_abs_error_pct": 4.0, "mean_signed_error_pct": 0.0}}


def test_scales():
    assert [scale_of(n) for n in (8, 64, 65, 512, 513)] == ["<=64", "<=64", "<=512", "<=512", ">512"]


def test_exact_nearest_and_outside():
    exact = band_for("h100-sxm", False, False, 32, BANDS)
    assert exact["match"] == "exact" and exact["mean_abs_error_pct"] == 10.0
    other_scale = band_for("h100-sxm", False, False, 1024, BANDS)
    assert other_scale["match"] == "nearest" and other_scale["family"] == "h100-sxm/dense/bf16/<=64"
    same_arch = band_for("h200-sxm", False, False, 1024, BANDS)  # Hopper: the H100 family, though at 64 GPUs
    assert same_arch["match"] == "nearest" and same_arch["family"] == "h100-sxm/dense/bf16/<=64"
    other_gpu = band_for("b200", False, False, 1024, BANDS)
    assert other_gpu["match"] == "nearest" and other_gpu["family"] == "a100-80gb/dense/bf16/>512"
    moe = band_for("h100-sxm", True, False, 64, BANDS)
    assert moe["match"] == "outside" and "outside every validated family" in moe["note"]
    assert moe["mean_abs_error_pct"] == 4.0


def test_band_is_the_measured_over_predicted_range_of_the_family():
    # every run of a family predicted too fast (signed error -15.5 .. -5.7%): measured took 6..18% longer
    biased = {"n_runs": 5, "mean_abs_error_pct": 11.0, "mean_signed_error_pct": -11.0,
              "min_signed_error_pct": -15.5, "max_signed_error_pct": -5.7}
    lo, hi = measured_ratio_range(biased)
    assert lo == pytest.approx(1 / 0.943) and hi == pytest.approx(1 / 0.845) and lo > 1
    # no median in this table: the mean signed error stands for it, 1 / (1 - 0.11) = 1.124
    assert band_text(biased) == "+12% (+6..+18%, n=5)"
    assert band_text({**biased, "median_signed_error_pct": -9.0}) == "+10% (+6..+18%, n=5)"
    one = {**biased, "n_runs": 1, "min_signed_error_pct": -15.5, "max_signed_error_pct": -15.5}
    assert band_text(one) == "+18% (n=1)"
    # a table without the signed extremes keeps the symmetric band of its mean absolute error
    assert measured_ratio_range(BANDS["all"]) == (pytest.approx(0.96), pytest.approx(1.04))
    summary = band_summary({**biased, "family": "f", "match": "exact", "note": "n"})
    assert summary["text"] == "+12% (+6..+18%, n=5)" and summary["measured_over_predicted"] == [lo, hi]
    assert summary["median_measured_over_predicted"] == pytest.approx(1 / 0.89)


def test_shipped_table_is_consistent_and_names_its_command():
    bands = load_bands()
    assert bands["command"].startswith("python -m echo_tune.plan.bands")
    assert sum(f["n_runs"] for f in bands["families"].values()) == bands["all"]["n_runs"] > 0
    for key, fam in bands["families"].items():
        assert key == family_key(fam) and fam["mean_abs_error_pct"] >= abs(fam["mean_signed_error_pct"]) - 1e-9
        assert fam["min_signed_error_pct"] <= fam["mean_signed_error_pct"] <= fam["max_signed_error_pct"]


def test_build_from_a_runs_csv_groups_rows_by_family():
    csv = published_runs("runs_megatron.csv")
    bands = build_bands([str(csv)])
    assert bands["all"]["n_runs"] >= 10
    assert all(k.startswith(("a100", "h100", "h800", "h200", "b200", "gb200")) for k in bands["families"])


def test_median_of_the_family_is_its_middle_run():
    rows = build_bands([str(published_runs("runs_megatron.csv"))])
    for fam in rows["families"].values():
        assert fam["min_signed_error_pct"] <= fam["median_signed_error_pct"] <= fam["max_signed_error_pct"]
    # three runs of -15, -5, +1%: the median is -5%, measured/predicted 1 / 0.95
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
    datasheet = band_or_none(default_profile(h100), h100, False, False, 8)
    assert datasheet["match"] == "exact" and datasheet["measured_over_predicted"]
    fitted = dataclasses.replace(default_profile(h100), name="fit", measured=True, gemm_max_efficiency=0.7)
    none = band_or_none(fitted, h100, False, False, 8)
    assert none["match"] == "none" and none["text"] == "-" and "'fit'" in none["note"]
    cpu = et.load_cluster(str(REPO / "tests" / "data" / "cpu-cluster.yaml"))
    assert band_or_none(default_profile(cpu), cpu, False, False, 1)["match"] == "none"


def test_every_gpu_preset_has_an_architecture_and_a_blackwell_rack_borrows_b200s_band():
    from echo_tune.config.loading import preset_names
    from echo_tune.plan.bands import ARCHITECTURES

    assert set(preset_names("gpus")) <= set(ARCHITECTURES)  # a new preset gets its architecture, or no band at all
    for rack in ("gb200-nvl72", "gb300-nvl72"):
        cluster = et.load_cluster(rack)
        band = band_or_none(default_profile(cluster), cluster, False, True, 64)
        assert band["match"] == "nearest" and band["family"].startswith("b200/")
