"""The host-bound regime: a pass whose kernels the GPU runs faster than the host can issue them.

CUDA kernel launches are asynchronous: the host enqueues kernels and the GPU runs them from its queue, so
the GPU idles only when the queue runs dry (CUDA C++ Programming Guide, "Asynchronous Concurrent Execution";
PyTorch "CUDA semantics": GPU operations are asynchronous, the CPU queues more work while the GPU runs). With
``h`` the host time to issue one kernel (Python, PyTorch dispatch, Transformer Engine and Megatron code
between two launches):

- after a host synchronisation the queue is empty: kernel j after it is issued ``j * h`` after the first and
  starts at the later of its issue and the end of the kernel before it (``queue_wait_s``). Megatron's MoE
  layer synchronises once per forward: the all-to-all dispatcher copies the token counts to the host and
  waits for them before the expert-parallel all-to-all (Megatron-LM d98e8a64ddf3 moe/token_dispatcher.py
  ``_maybe_dtoh_and_synchronize``: ``self.d2h_event.synchronize()`` at ``cuda_sync_point``
  "before_ep_alltoall"; the all-gather dispatcher's ``tokens_per_expert ... .cpu()`` likewise; none with
  drop-and-pad, ``cuda_sync_point = "no_sync"``), so the window from that point to the next layer's is timed
  as a queue from empty;
- elsewhere the host keeps the lead it has, and a pass waits only for what its kernels' host time exceeds its
  GPU time (``steady_wait_s``).

``h`` is ``ClusterProfile.host_time_per_kernel_s``: a parameter fitted on training runs
(``calibrate fit --runs --params ...,host``); a profile that fits none uses the one fitted on the published runs
(``cost/host/host_time.py``, 38 us); 0 in a profile leaves every pass at its GPU time.
Not modelled: the ``torch.cuda.synchronize()`` Megatron runs after each batched pipeline send/receive of the
non-interleaved schedule (p2p_communication.py, ``batch_p2p_sync``), which empties the queue once per chunk: timing
each pass's first layer from an empty queue (``queue_wait_s``) adds at most 0.3% to any non-interleaved published row
(GPT-OSS 120B on 64 H100: 12 ms of 3.79 s; estimated 2026-12-05).
"""

from __future__ import annotations


def queue_wait_s(kernels: list[tuple[float, float]], host_per_kernel_s: float) -> float:
    """Time the GPU waits on the host over a window that starts with an empty queue: (window end) - (sum of
    GPU times).

    ``kernels``: (number of kernels issued, their GPU time together) per op in issue order, an op's kernels
    taken as equally long (a grouped GEMM: one GEMM and its quantisations per expert); an op replayed from
    a CUDA graph issues none (0, its time), the first op of each graph one (the graph's launch). The first kernel is issued at 0; closed form per op of n kernels
    of g each, its first issued at s, the GPU free at f: the op ends at max(f + n g, s + n g, s + (n - 1) h + g).
    """
    if host_per_kernel_s <= 0.0:
        return 0.0
    h = host_per_kernel_s
    issue = gpu_free = busy = 0.0
    for n, t in kernels:
        busy += t
        if n <= 0:  # replayed inside a CUDA graph: runs as soon as the GPU is free and the host got there
            gpu_free = max(gpu_free, issue) + t
            continue
        g = t / n
        gpu_free = max(gpu_free + t, issue + t, issue + (n - 1) * h + g)
        issue += n * h
    return max(0.0, gpu_free - busy)


def steady_wait_s(kernels: list[tuple[float, float]], host_per_kernel_s: float) -> float:
    """Time a pass with no host synchronisation waits on the host: its host time over its GPU time, if any."""
    issued = sum(n for n, _ in kernels)
    return max(0.0, issued * host_per_kernel_s - sum(t for _, t in kernels))


def host_wait_s(kernels: list[tuple[float, float]], host_per_kernel_s: float, sync_at: int | None) -> float:
    """The pass's wait on the host: a queue from empty from ``sync_at`` (the index in ``kernels`` of the first op
    after the host synchronisation; the ops before it close the window, as the next layer's), else steady."""
    if host_per_kernel_s <= 0.0:
        return 0.0
    if sync_at is None:
        return steady_wait_s(kernels, host_per_kernel_s)
    return queue_wait_s(kernels[sync_at:] + kernels[:sync_at], host_per_kernel_s)
