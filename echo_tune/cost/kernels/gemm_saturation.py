"""The GEMM size saturation g(m) g(n) g(k), g(x) = x / (x + x_half): small dimensions leave tensor cores idle
(tile quantisation and wave tails). cost/kernels/compute.py costs GEMMs with it; cost/kernels/gemm_benchmarks.py fits to it.
"""

from __future__ import annotations


def size_saturation(m: float, n: float, k: float, half: float) -> float:
    """g(m) g(n) g(k), g(x) = x / (x + half): the share of a large GEMM's rate a GEMM of shape (m, n, k) keeps."""
    return (m / (m + half)) * (n / (n + half)) * (k / (k + half))
