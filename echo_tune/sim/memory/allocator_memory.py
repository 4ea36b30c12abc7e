"""What PyTorch's caching allocator holds besides the model's weights, gradients, optimizer states and saved
activations: the GEMM libraries' workspaces (kept for the whole run) and the loss's working set (the
logits beside their fp32 copy, for the length of one micro-batch's loss).

Both are bytes ``torch.cuda.memory_stats()`` counts ("allocated_bytes.all.current" / ".peak", which
Megatron-LM logs as ``mem-allocated-bytes`` / ``mem-max-allocated-bytes``), so they are part of what a layout
needs; ``benchmarks/functional_coverage.py`` sets them against Megatron-LM's functional-test goldens
(docs/memory.md).

Workspaces (each a ``torch.empty`` / caching-allocator block held from the first GEMM on):
- PyTorch's cuBLAS workspaces, each sized by ``CUBLAS_WORKSPACE_CONFIG`` ``:SIZE_KiB:COUNT`` (the sum of
  SIZE x COUNT). Megatron-LM's ``--deterministic-mode`` sets ``:4096:8`` = 32 MiB (d98e8a64ddf3
  megatron/training/determinism.py ``DETERMINISM_ENV_VAR_DEFAULTS``), as do its functional tests' ENV_VARS;
  unset, current PyTorch takes ``:4096:8`` on compute capability 9, 10 and 12 ("32MiB for Hopper and
  Blackwell") and ``:4096:2:16:8`` (8 MiB + 128 KiB) elsewhere (aten/src/ATen/cuda/CublasHandlePool.cpp
  ``parseChosenWorkspaceSize``; releases before it gave 32 MiB to sm90 only, and the GB200 goldens show
  both). PyTorch keeps one workspace per (cuBLAS handle, stream) (``cublas_handle_stream_to_workspace``) and
  its handles per thread (``DeviceThreadHandlePool``); training runs GEMMs on two threads, the forward on the
  Python thread and the backward on the autograd engine's device thread: two workspaces. The goldens show
  two: on A100 the non-deterministic cases (8 MiB default) sit 43-48 MiB under the deterministic ones
  (32 MiB) = 2 x (32 - 8.1) MiB.
- Transformer Engine's cuBLASLt workspace: 32 MiB on compute capability >= 9 (Hopper, Blackwell), 4 MiB
  before (transformer_engine/pytorch/module/base.py ``get_cublas_workspace_size_bytes``); with grouped
  GEMMs (``--moe-grouped-gemm``, TE's GroupedLinear) four more for its GEMM streams
  (``get_multi_stream_cublas_workspace``, ``num_streams`` = 4). A100 vs H100 goldens of the same cases
  differ by 28 MiB = 32 - 4 (dense) and ~140 MiB = 5 x 28 (grouped-GEMM MoE).

Loss working set: the output layer's bf16 logits [s/cp, b, v/tp] are held by the model's forward until
the loss returns, beside the fp32 tensor the cross-entropy keeps for backward (counted in the traced
activations, workload/ends/heads.py and workload/ends/loss.py): 2 more bytes per logit, in forward (logits + fp32
copy) as in backward (fp32 softmax + the bf16 logits gradient). Megatron's unfused path
(core/tensor_parallel/cross_entropy.py: ``.float()``, then in-place ops) and TE's fused kernel (one fp32
gradient) stop there; the ``native`` fused path compiles ``calculate_predicted_logits`` with
``jit_fuser`` (core/fusions/fused_cross_entropy.py), which cannot update its input in place, so the fp32
copy and the fp32 exponentials are live together: 4 bytes more again.
"""

from __future__ import annotations

from echo_tune.config.specs.cluster import GPUSpec
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig

MIB = 1 << 20
# Compute capability of the GPU presets (NVIDIA, https://developer.nvidia.com/cuda-gpus): A100 8.0,
# H100 / H800 / H200 9.0, B200 / GB200 10.0, GB300 (Blackwell Ultra) 10.3. A GPU not listed: 9.0 if it has
# FP8 tensor cores, else 8.0.
COMPUTE_CAPABILITY = {"a100-40gb": (8, 0), "a100-80gb": (8, 0), "h100-sxm": (9, 0), "h800-sxm": (9, 0),
                      "h200-sxm": (9, 0), "b200": (10, 0), "gb200": (10, 0), "gb300": (10, 3)}
TORCH_CUBLAS_WORKSPACES = 2  # forward thread and autograd's backward thread (module docstring)
TE_GROUPED_GEMM_STREAMS = 4
# extra bytes per logit at the loss, beyond the fp32 tensor kept for backward (module docstring)
LOSS_EXTRA_BYTES_PER_LOGIT = {"unfused": 2, "native": 6, "te": 2}


def compute_capability(gpu: GPUSpec) -> tuple[int, int]:
    return COMPUTE_CAPABILITY.get(gpu.name, (9, 0) if gpu.peak_fp8_tflops is not None else (8, 0))


def torch_cublas_workspace_bytes(gpu: GPUSpec, deterministic_mode: bool) -> int:
    """One of PyTorch's cuBLAS workspaces: ``:4096:8`` under --deterministic-mode or on Hopper / Blackwell
    (compute capability 9, 10, 12), else ``:4096:2:16:8``."""
    if deterministic_mode or compute_capability(gpu)[0] in (9, 10, 12):
        return 4096 * 1024 * 8
    return 4096 * 1024 * 2 + 16 * 1024 * 8


def te_workspace_bytes(gpu: GPUSpec) -> int:
    """Transformer Engine's cuBLASLt workspace of one GEMM stream."""
    return 32 * MIB if compute_capability(gpu)[0] >= 9 else 4 * MIB


def workspace_bytes(gpu: GPUSpec, model: ModelSpec, parallel: ParallelConfig) -> int:
    """GEMM-library workspaces one rank holds for the whole run."""
    total = TORCH_CUBLAS_WORKSPACES * torch_cublas_workspace_bytes(gpu, parallel.deterministic_mode)
    if model.transformer_impl == "transformer_engine":
        streams = 1 + (TE_GROUPED_GEMM_STREAMS if model.is_moe and model.moe_grouped_gemm else 0)
        total += streams * te_workspace_bytes(gpu)
    return total


def loss_impl(model: ModelSpec) -> str:
    return model.cross_entropy_fusion_impl if model.cross_entropy_loss_fusion else "unfused"


def loss_working_bytes(model: ModelSpec, parallel: ParallelConfig) -> int:
    """Bytes live at the loss of one micro-batch beyond the traced saved tensors (module docstring)."""
    tp, cp = parallel.tensor_model_parallel_size, parallel.context_parallel_size
    logits = parallel.micro_batch_size * (model.seq_length // cp) * (model.padded_vocab_size(tp) // tp)
    return LOSS_EXTRA_BYTES_PER_LOGIT[loss_impl(model)] * logits
