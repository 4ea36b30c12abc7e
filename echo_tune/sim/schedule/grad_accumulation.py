"""``--no-gradient-accumulation-fusion``: the weight gradient is added into main_grad by a separate kernel.

Megatron-LM d98e8a64ddf3: with gradient-accumulation fusion (the default) the weight-gradient GEMM
accumulates straight into ``weight.main_grad`` (core/tensor_parallel/layers.py
``LinearWithGradAccumulationAndAsyncCommunication.backward``: ``wgrad_gemm_accum_fp32`` /
``wgrad_gemm_accum_fp16``; TE linears take ``fuse_wgrad_accumulation``). Without it the GEMM returns a
gradient in the parameter dtype and DDP's per-parameter hook adds it, once per micro-batch, into the
main-grad buffer (core/distributed/distributed_data_parallel.py ``_make_backward_post_hook``:
``param.main_grad.add_(param.grad.data)``, then ``param.grad = None``): a memory-bound kernel per
weight that reads the main grad (fp32, or bf16 with ``--grad-reduce-in-bf16``) and the temporary
gradient (bf16) and writes the main grad back. Norm and bias gradients take this path either way
(small; counted here for every parameter, an upper bound of a few thousand parameters per layer).

Memory: each temporary gradient lives from its GEMM to its hook (one weight at a time, the largest
being fc1's); not added to the peak (below the activations' granularity). Not in the GEMM times
either: the fused GEMM's read-modify-write of main_grad in its epilogue is not costed today.
"""

from __future__ import annotations

from echo_tune.sim.data_parallel.dp import grad_bytes_per_param
from echo_tune.sim.schedule.linear_layers import linear_param_delta

PARAM_GRAD_BYTES = 2.0
"""The temporary weight gradient's dtype: the parameters' (bf16 / fp16)."""


def accumulation_bytes_per_param(parallel) -> float:
    """Bytes one unfused accumulation moves per parameter: read main_grad + read grad + write main_grad."""
    if parallel.gradient_accumulation_fusion:
        return 0.0
    main = grad_bytes_per_param(parallel)
    grad = main if parallel.precision == "fp32" else PARAM_GRAD_BYTES
    return 2 * main + grad


def accumulation_time_s(params: int, parallel, profile, tensors: int = 0) -> float:
    """Extra backward time of one micro-batch over ``params`` parameters in ``tensors`` weight tensors."""
    per_param = accumulation_bytes_per_param(parallel)
    if not per_param or not params:
        return 0.0
    return params * per_param / (profile.memory_bandwidth_gbyte_s * 1e9) + tensors * profile.kernel_launch_overhead_s


def chunk_accumulation_s(pieces: dict, mix, layout, parallel, profile, linears=None) -> list[list[float]]:
    """Per stage and chunk: the unfused accumulation time of one micro-batch's backward (0 when fused).

    ``mix[stage][chunk]`` = (dense, MoE) layers; the embedding and output weights count on the first
    and last chunk; one kernel per linear weight group of each layer (``Trace.linear_param_counts``).
    ``linears[stage][chunk]``: the (dense, MoE) layers among them that run the gated delta net (sim/schedule/linear_layers.py)."""
    p, v = len(layout.stage_chunk_layers), layout.virtual_pipeline_size
    layer, moe = pieces["layer"], pieces.get("moe_layer")
    out = []
    for s in range(p):
        row = []
        for c in range(v):
            dense, k = mix[s][c]
            params = dense * layer.param_count + (k * moe.param_count if moe else 0)
            tensors = dense * len(layer.linear_param_counts) + (k * len(moe.linear_param_counts) if moe else 0)
            if linears:
                more_params, more_tensors = linear_param_delta(pieces, linears[s][c])
                params, tensors = params + more_params, tensors + more_tensors
            if s == 0 and c == 0:
                params, tensors = params + pieces["embedding"].param_count, tensors + 1
            if s == p - 1 and c == v - 1:
                params, tensors = params + pieces["output"].param_count, tensors + 1
            row.append(accumulation_time_s(params, parallel, profile, tensors))
        out.append(row)
    return out
