"""benchmarks/attention_vs_cudnn.py: echo-tune's fused-attention kernels against cuDNN's own training SDPA benchmark."""

import pytest
import attention_vs_cudnn as avc


@pytest.fixture(scope="module")
def rows():
    return avc.measure()


def test_every_published_row_is_compared(rows):
    data = avc.read_rows()
    assert len(rows) == len(data) == 52
    assert {r["gpu"] for r in rows} == {"h200-sxm", "gb200", "gb300"}
    assert all(r["measured_ms"] > 0 and r["model_sustained_ms"] >= r["model_peak_ms"] > 0 for r in rows)


def test_the_traced_kernel_is_the_benchmark_shape():
    # Llama-3.1 shape, 2 x 4096 tokens, 64 query heads of 128: the causal forward counts the unmasked half,
    # 4 * b * h * s^2 * d / 2 FLOPs, as cuDNN's TFLOP/s column does (1,408 TFLOP/s at 0.391 ms on GB200)
    row = next(r for r in avc.read_rows() if r["gpu"] == "gb200" and r["config"] == "llama3.1"
               and r["seq"] == "4096" and r["mask"] == "top_left" and r["pass"] == "fwd")
    op = avc.attention_op(row)
    assert op.causal and op.flops == pytest.approx(4 * 2 * 64 * 4096 ** 2 * 128 / 2)
    assert op.flops / (float(row["time_ms"]) * 1e-3) / 1e12 == pytest.approx(float(row["tflops"]), rel=0.01)
    no_mask = avc.attention_op({**row, "mask": "no_mask"})
    assert not no_mask.causal and no_mask.flops == pytest.approx(2 * op.flops)


def test_full_attention_is_priced_no_faster_than_cudnn_runs_it(rows):
    # Causal and unmasked attention at head dim 128 (Llama) and 192 / 128 (DeepSeek-V3's MLA): at the GPU's peak
    # clock, the benchmark's like-for-like, the H100-derived efficiencies price every kernel between 0.8x and 1.45x
    # cuDNN's time on H200, GB200 and GB300; at the sustained clock of a training step, never faster than cuDNN
    # (measured 2026-12-06: medians 1.07-1.32 at peak clock, forward slower than backward, GB300's forward most)
    full = [r for r in rows if not r["window"]]
    assert len(full) == 40
    assert all(0.8 <= r["ratio_peak"] <= 1.45 for r in full), [
        (r["gpu"], r["config"], r["mask"], r["seq"], r["pass"], round(r["ratio_peak"], 2)) for r in full
        if not 0.8 <= r["ratio_peak"] <= 1.45]
    assert min(r["ratio_sustained"] for r in full) > 0.9


@pytest.mark.xfail(strict=True, reason="a 128-key sliding window is priced at its unmasked FLOPs, which "
                   "leave the kernel bound by its HBM bytes (q, k, v, o): cuDNN's window-128 kernels take 2.5-2.9x "
                   "that on GB200 / GB300 (whole 128-key tiles, a per-tile cost a two-tile loop does not amortise); "
                   "estimated 18 window layers x 5 micro-batches x 0.43 ms = 39 ms of GPT-OSS 120B's 5.19 s step on "
                   "64 GB200, not modelled")
def test_short_window_attention_within_a_quarter_of_cudnn(rows):
    window = [r for r in rows if r["window"] == "128"]
    assert len(window) == 8
    assert all(0.75 <= r["ratio_peak"] <= 1.25 for r in window)
