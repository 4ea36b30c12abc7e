"""The host-bound regime: a pass whose kernels the GPU runs faster than the host can issue them.

CUDA kernel launches are asynchronous: the host enqueues kernels and the GPU runs them from its queue, so
the GPU idles only when the queue runs dry (CUDA C++ Programming Guide, "Asynchronous Concurrent Execution";
PyTorch "CUDA semantics": GPU operations are asynchronous, the CPU queues more work while the GPU runs). What each
kernel costs the host depends on who launches it:

- a kernel the framework issues from Python (one per traced op; one per local expert and GEMM of a grouped GEMM,
  which Transformer Engine's ``GroupedLinear`` runs expert by expert): ``h``, the Python, PyTorch dispatch,
  Transformer Engine and Megatron code between two such launches;
- a kernel issued by one bare PyTorch call in a Python loop (GPT-OSS's fc2 bias, ``t + b * p`` per local expert,
  sub-region ``SINGLE_CALL_SUBREGIONS``): ``HOST_TORCH_CALL_S``, one call's dispatch and launch, not the module
  call's Python that ``h`` stands for;
- a kernel TE's C++ launches inside that call (an FP8 GEMM's quantisations: ``HOST_LAUNCH_S``, the CUDA launch
  path alone). Two pairs of published rows measure the difference: FP8 current scaling (three quantisation kernels)
  against MXFP8 (one), same recipe and layout, no synchronisation, no CUDA graphs, 64 / 256 B200
  (``benchmarks/row_pairs.py``): measured 1.04 and 0.95 per token; charged ``h`` per quantisation kernel the model
  said 1.76 and 1.84, charged the launch it says 1.07 and 1.06.

How the host's time turns into GPU idle time:

- after a host synchronisation the queue is empty: kernel j after it is issued when the host's time for the j
  before it has passed and starts at the later of its issue and the end of the kernel before it
  (``queue_wait_s``). Megatron's MoE
  layer synchronises once per forward: the all-to-all dispatcher copies the token counts to the host and
  waits for them before the expert-parallel all-to-all (Megatron-LM d98e8a64ddf3 moe/token_dispatcher.py
  ``_maybe_dtoh_and_synchronize``: ``self.d2h_event.synchronize()`` at ``cuda_sync_point``
  "before_ep_alltoall"; the all-gather dispatcher's ``tokens_per_expert ... .cpu()`` likewise; none with
  drop-and-pad, ``cuda_sync_point = "no_sync"``), so the window from that point to the next layer's is timed
  as a queue from empty;
- a copy of a host value to the GPU from pageable memory (``torch.tensor(value, device=cuda)``: PyTorch's
  ``copy_`` without ``non_blocking`` calls ``cudaMemcpyAsync`` and then ``cudaStreamSynchronize``,
  c10/cuda ``memcpy_and_sync``) empties the queue the same way: the fused quick-GeGLU of GPT-OSS's experts makes
  one per call (``HOST_SYNC_OP``, workload/mlp/activations.py);
- elsewhere the host keeps the lead it has, and a pass waits only for what its kernels' host time exceeds its
  GPU time (``steady_wait_s``).

``h`` is ``ClusterProfile.host_time_per_kernel_s``: a parameter fitted on training runs
(``calibrate fit --runs --params ...,host``); a profile that fits none uses the one fitted on the published runs of
x86 hosts (``cost/host/host_time.py``); 0 in a profile leaves every pass at its GPU time.
Not modelled: the ``torch.cuda.synchronize()`` Megatron runs after each batched pipeline send/receive of the
non-interleaved schedule (p2p_communication.py, ``batch_p2p_sync``), which empties the queue once per chunk: timing
each pass's first layer from an empty queue (``queue_wait_s``) adds at most 0.3% to any non-interleaved published row
(GPT-OSS 120B on 64 H100: 12 ms of 3.79 s; estimated 2026-12-05).
"""

from __future__ import annotations

HOST_LAUNCH_S = 3.8e-6
"""The host's time to launch one kernel from C++ (no Python, no PyTorch dispatch between two launches): NVIDIA's
"Getting Started with CUDA Graphs" (A. Gray, NVIDIA Technical Blog, 2019) launched ~2.9 us kernels back-to-back into
a stream at 3.8 us each, the launch path setting the pace. What a kernel costs the host when Transformer Engine's C++
launches it inside a call the host already paid for: the quantisations of an FP8 GEMM's operands (``tex.quantize`` /
``tex.split_quantize``; current scaling's amax, scale and cast kernels, NVIDIA/TransformerEngine@ad3f651f1dad
``transformer_engine/pytorch/csrc/quantizer.cpp`` ``Float8CurrentScalingQuantizer::quantize_impl``)."""


HOST_TORCH_CALL_S = 13.5e-6
"""The host's time for one PyTorch op called from Python on a DGX H100 host, its CUDA launch included: a torch
``nn.Linear`` forward took 13.48 us of CPU time on a DGX H100 (Xeon Platinum 8480C; NVIDIA/TransformerEngine issue
2053, BF16, hidden 2048, 8,192 tokens). A module call around one ATen op: an upper bound for a bare tensor op."""

SINGLE_CALL_SUBREGIONS = frozenset({("moe", "expert_bias")})
"""(region, sub-region) whose every traced op is one bare PyTorch call from Python (workload/mlp/moe.py)."""

DTOH_OP = "echo_tune.device_to_host"
"""The traced op that stands for a non-blocking copy of a small tensor to the host on the dispatcher's own
device-to-host stream (workload/mlp/dispatch_preprocess.py): no time on the compute stream, one Python call on the
host."""

HOST_READ_OP = "echo_tune.host_reads"
"""The traced op that stands for a kernel whose output size the host reads before it goes on (a boolean mask's
nonzero, ``repeat_interleave``'s total: workload/mlp/flex_metadata.py): the queue empties after it."""

HOST_SYNC_OP = "echo_tune.host_scalar_to_device"
"""The traced op that stands for a synchronising host-to-device copy of one scalar (workload/mlp/fused_elementwise.py)."""


def queue_wait_s(kernels: list[tuple[int, float, float]]) -> float:
    """Time the GPU waits on the host over a window that starts with an empty queue: (window end) - (sum of
    GPU times).

    ``kernels``: (kernels issued, the host's time to issue them, their GPU time) per op in issue order, an op's
    kernels taken as equally long and issued evenly over its host time (a grouped GEMM: one GEMM per expert and its
    quantisations); an op replayed from a CUDA graph issues none (0, 0, its time), the first op of each graph one
    (the graph's launch). The first kernel is issued at 0; closed form per op of n kernels of g each and host time H,
    its first issued at s, the GPU free at f: the op ends at max(f + n g, s + n g, s + H (n - 1) / n + g).
    """
    issue = gpu_free = busy = 0.0
    for n, host_s, t in kernels:
        busy += t
        if n <= 0:  # replayed inside a CUDA graph: runs as soon as the GPU is free and the host got there
            gpu_free = max(gpu_free, issue) + t
            continue
        gpu_free = max(gpu_free + t, issue + t, issue + host_s * (n - 1) / n + t / n)
        issue += host_s
    return max(0.0, gpu_free - busy)


def steady_wait_s(kernels: list[tuple[int, float, float]]) -> float:
    """Time a pass with no host synchronisation waits on the host: its host time over its GPU time, if any."""
    return max(0.0, sum(h for _, h, _ in kernels) - sum(t for _, _, t in kernels))


def host_wait_s(kernels: list[tuple[int, float, float]], sync_at: int | tuple[int, ...] | None) -> float:
    """The pass's wait on the host: a queue from empty from each synchronisation (``sync_at``: the index, or
    indices, in ``kernels`` of the first op after a host synchronisation; each window runs to the next, the ops
    before the first close the last window, as the next layer's), else steady."""
    if not any(h > 0.0 for _, h, _ in kernels):
        return 0.0
    syncs = sorted(set((sync_at,) if isinstance(sync_at, int) else sync_at or ()))
    if not syncs:
        return steady_wait_s(kernels)
    ends = syncs[1:] + [len(kernels)]
    windows = [kernels[a:b] for a, b in zip(syncs, ends)]
    windows[-1] = windows[-1] + kernels[:syncs[0]]
    return sum(queue_wait_s(w) for w in windows)
