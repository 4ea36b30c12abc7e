"""The fastest published run of the same model on the same GPU beside a prediction (plan/anchors.py)."""

from pathlib import Path

import pytest

import echo_tune as et
from echo_tune.plan.anchors import FASTER_THAN_MEASURED, anchor, anchor_text, arch_key, per_token_gpu_s
from echo_tune.plan.bands import load_bands

REPO = Path(__file__).resolve().parents[2]


def _run(name, gpu, model, per_token_s, num_gpus=16, precision="fp8"):
    return {"name": name, "source": "org/repo@abc", "gpu": gpu, "arch": arch_key(model), "num_gpus": num_gpus,
            "precision": precision, "per_token_gpu_s": per_token_s}


def test_per_token_by_hand():
    # 24.8478 s for 512 x 4096 tokens on 16 GPUs: 189.6 us per token per GPU
    assert per_token_gpu_s(24.8478, 16, 512, 4096) == pytest.approx(189.6e-6, rel=1e-3)


def test_same_architecture_whatever_the_preset_calls_its_unused_dense_width():
    model = et.load_model("qwen3-30b-a3b")
    assert arch_key(model) == arch_key(model.replace(ffn_hidden_size=768))  # every layer is MoE: not used
    assert arch_key(model) != arch_key(model.replace(seq_length=8192))
    dense = et.load_model("llama3-8b")
    assert arch_key(dense) != arch_key(dense.replace(ffn_hidden_size=8192))


def test_anchor_is_the_fastest_run_of_the_model_on_that_gpu():
    model = et.load_model("qwen3-30b-a3b")
    runs = [_run("slow", "h100-sxm", model, 200e-6), _run("fast", "h100-sxm", model, 150e-6),
            _run("other-gpu", "b200", model, 50e-6), _run("other-model", "h100-sxm", et.load_model("llama3-8b"), 1e-6)]
    step = 150e-6 * 512 * 4096 / 16 * 0.5  # half the fast run's time per token
    a = anchor(model, "h100-sxm", 16, 512, step, runs=runs)
    assert a["run"] == "fast" and a["n_runs"] == 2 and a["ratio"] == pytest.approx(0.5)
    text = anchor_text(a)
    assert "fastest of 2 published run(s)" in text and "150.0 us" in text and "2.0x faster than any measured" in text
    at_par = anchor(model, "h100-sxm", 16, 512, step * 2, runs=runs)
    assert at_par["ratio"] == pytest.approx(1.0) and "faster than any" not in anchor_text(at_par)
    assert anchor(model, "h200-sxm", 16, 512, step, runs=runs) is None  # no run on that GPU
    assert anchor(model.replace(seq_length=8192), "h100-sxm", 16, 512, step, runs=runs) is None


def test_shipped_table_keeps_every_validated_run_for_anchors():
    bands = load_bands()
    assert len(bands["runs"]) == bands["all"]["n_runs"]
    a = anchor(et.load_model("qwen3-30b-a3b"), "h100-sxm", 16, 512, 7.95)
    # the fastest of the model's H100 runs: HybridEP with EP overlap (Megatron-Bridge #5094, 20.99 s for 1,024 x 4,096
    # tokens on 16 GPUs = 80.1 us per token and GPU), not the 2025-26 tables' FP8 rows (189.6 us and slower)
    assert a["run"] == "prs5094-qwen3-30b-a3b-bf16-hybridep-epoverlap-16xh100" and a["n_runs"] == 9
    assert a["measured_per_token_gpu_s"] == pytest.approx(20.99203 * 16 / (1024 * 4096), rel=1e-6)
    assert FASTER_THAN_MEASURED < a["ratio"] < 1  # 7.95 s for 512 sequences: 60.6 us, 0.76x
    # how close the simulator came on the anchor itself: that row's out-of-sample error, as docs/accuracy.md lists it
    line = next(row for row in (REPO / "docs" / "accuracy.md").read_text().splitlines() if f"| {a['run']} |" in row)
    page_pct = float(line.split("|")[5].strip().rstrip("%"))
    assert a["run_error_pct"] == pytest.approx(page_pct, abs=0.05)
    assert f"(simulated {a['run_error_pct']:+.0f}% out of sample)" in anchor_text(a)
