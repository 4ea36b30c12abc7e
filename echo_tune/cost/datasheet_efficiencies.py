"""The efficiency assumptions of datasheet-derived profiles (``cost/profile.py default_profile``), as data.

Each is a physical fraction of a datasheet number or a per-kernel time, with its source beside it, so that a reader
can replace it with a measurement (``echo-tune calibrate``); a profile built from them is labelled datasheet-derived.
"""

# Efficiency assumptions of datasheet-derived profiles. Each is a physical fraction of a datasheet
# number, stated here so a reader can replace it with a measurement (``echo-tune calibrate``).
# - Large cuBLAS fp16/bf16 GEMMs reach ~80% of dense tensor-core peak on A100 and H100 (NVIDIA's
#   "Matrix Multiplication Background" guide and public cuBLAS benchmarks show 75-90%).
DATASHEET_GEMM_EFFICIENCY = 0.80
# - Large FP8 GEMMs (cuBLASLt, Transformer Engine) reach a smaller fraction of the doubled FP8 peak:
#   ~1,300-1,450 of 1,979 dense TFLOP/s on H100 SXM in public cuBLASLt/TE GEMM benchmarks (8k-16k
#   square shapes), i.e. ~0.70; the 1-byte operands double the arithmetic intensity, but the
#   epilogue (scaling, bf16 output) and the doubled rate leave more of the SM idle.
DATASHEET_FP8_GEMM_EFFICIENCY = 0.70
# - A GEMM dimension of 128 (one CTA tile) is half-efficient: saturation g(x) = x / (x + 128).
DATASHEET_GEMM_HALF_SATURATION_DIM = 128.0
# - Streaming kernels reach ~85% of HBM datasheet bandwidth (STREAM-like copy on A100/H100).
DATASHEET_MEMORY_EFFICIENCY = 0.85
# - Each kernel of an eager PyTorch step costs ~4 us of GPU time beyond its work (the gap behind the kernel before
#   it, its ramp-up and the tail of its last wave); a GPU-timed 1-GPU copy of the A100 calibration set has a 4.4 us
#   intercept (calibration/azure-ndv4-a100-40gb/profile.yaml). A CUDA graph shortens only the gap
#   (cost/kernels/compute.py GRAPH_REPLAY_SAVING_S); the host's time to issue the kernel is cost/host/host_bound.py's.
DATASHEET_KERNEL_LAUNCH_S = 4.0e-6
# - Fused attention (Transformer Engine's cuDNN backend, what Megatron-Core runs by default) on H100 SXM5,
#   head dim 128, sequence 2k/4k/8k: forward 617/609/600 TFLOP/s, backward 465/499/518 TFLOP/s (cuDNN bars
#   of Shah et al. 2024, FlashAttention-3, arXiv 2407.08608, attention speed figures; backward FLOPs
#   counted as 2.5x forward, as here). Forward ~0.61 and backward ~0.50 of the 989 TFLOP/s peak: the
#   backward's five matmuls, dQ accumulation and recomputed softmax keep it ~18% below the forward.
#   FlashAttention-2 on A100 shows the same split (Dao 2023, arXiv 2307.08691: forward up to ~73% of
#   peak, backward lower).
#   Those are kernels without the causal mask. With it (FLOPs counted as the unmasked half), the same
#   paper's causal forward bars are 484/518/529 TFLOP/s at 2k/4k/8k, 0.85 of the unmasked rate at 4k
#   (0.78-0.88 over 2k-8k): diagonal tiles half wasted and a triangle of work spread unevenly over the
#   SMs. The paper shows no causal backward, so the factor applies to forward kernels only (applying the
#   forward's ratio to the backward too is an extrapolation left out; benchmarks/step_audit.py, docs/accuracy.md).
DATASHEET_ATTENTION_EFFICIENCY = 0.61
DATASHEET_ATTENTION_BACKWARD_EFFICIENCY = 0.50
DATASHEET_ATTENTION_CAUSAL_FACTOR = 0.85
# - NCCL's bus bandwidth reaches ~80% of NVLink one-direction line rate, and of NIC line rate.
DATASHEET_LINK_EFFICIENCY = 0.80
# - Per-step latency of a ring step: ~5 us inside a node (NVLink), ~10 us across nodes (IB).
DATASHEET_INTRA_LATENCY_S = 5.0e-6
DATASHEET_INTER_LATENCY_S = 10.0e-6
# - Echo (arXiv 2412.12487) measures compute kernels slowed by communication overlap; absent a
#   measurement we assume a 10% slowdown of compute and 5% of communication.
DATASHEET_COMPUTE_SLOWDOWN = 1.10
DATASHEET_COMM_SLOWDOWN = 1.05
