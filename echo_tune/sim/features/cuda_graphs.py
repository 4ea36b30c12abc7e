"""CUDA graphs (``--cuda-graph-impl``, ``--cuda-graph-modules``): which kernels are captured, and the memory
the graphs keep. Megatron-LM d98e8a64ddf3: core/transformer/cuda_graphs.py, transformer_layer.py,
core/full_cuda_graph.py, docs/user-guide/features/cuda_graph.md.

Time. Each compute op pays the profile's per-kernel overhead on the GPU (cost/kernels/compute.py: the gap behind the
kernel before it, its ramp-up and tail) and one host launch (cost/host/host_bound.py). A kernel inside a captured graph
is replayed by the GPU: the host issues one launch per graph replayed instead of one per kernel, and the kernel
starts closer behind the one before it, which saves ``GRAPH_REPLAY_SAVING_S`` (0.4 us, cost/kernels/compute.py) of its
per-kernel time, not all of it. ``capture_spec`` names the captured traced regions per piece, as a string (cost
contexts are cached on plain values), and sim/schedule/costing.py ``phase_cost`` applies both (full_iteration: one graph per
step, launched once, so no host launch per pass).

- full_iteration: every forward / backward op of every piece (FullCudaGraphWrapper captures the
  forward-backward of the whole step; the optimizer step is not captured).
- local / transformer_engine, no modules: the whole transformer layer, one graph per layer and pass
  (TransformerLayer: "If full scope (no specific sub-scope), cudagraph the entire layer").
- attn: TransformerLayer._forward_attention (input norm, QKV, core attention, projection, residual);
  mlp: _forward_mlp of dense layers (pre-MLP norm, MLP, residual); moe: the same on MoE layers;
  moe_router: the pre-MLP norm, the router and the shared expert (not overlapped: echo-tune does not model
  the shared-expert overlap) of MoE layers (``_get_submodules_under_cudagraphs``); moe_preprocess: the
  dispatcher's metadata step (sub-region "preprocess", workload/mlp/dispatch_preprocess.py), in the router's graph.

Memory (``graph_static_bytes_per_layer``): the activations a captured layer saves for backward live in the
graph pool but are the same tensors eager mode keeps (counted already); what graphs add is their static
input / output buffers, kept for every micro-batch whose backward has not run (a graph is replayed into
its buffers, which are reused only after that micro-batch's backward):
- transformer_engine: ``TECudaGraphHelper._get_sample_arguments`` makes static inputs per (layer,
  micro-batch in flight) -- hidden states [s/cp(/tp with SP), b, h] in bf16 and, where attention is
  captured, the [b, 1, s/cp, s] bool attention mask (TransformerLayer.get_layer_static_inputs) -- and
  make_graphed_callables keeps each graph's static output [s', b, h]: per graph
  ``input + output (+ mask)`` bytes.
- local: graphs of one micro-batch chain, one layer's output buffer being the next graph's input
  (cuda_graphs.py make_weakref: "a previous layer's output reused as this graph's input"), and the input
  the layer saves for backward is that same buffer; whole-layer graphs add one boundary copy per chunk
  (the chunk's first input, copied into the first graph's static buffer), per-module graphs one input and
  one output copy per graph (eager code runs between them).
- full_iteration: StaticBufferLoader keeps each micro-batch's data batch (tokens, labels, position ids
  int64 and the float loss mask: 28 bytes per token) for the whole step.
"""

from __future__ import annotations

import functools

from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig

ATTN_REGIONS = ("input_norm", "qkv", "core_attention", "mla_up_proj", "output_gate", "attention_proj",
                "attention_residual")
MLP_REGIONS = ("mlp_norm", "mlp", "mlp_residual")
MOE_REGIONS = ("mlp_norm", "moe", "mlp_residual")
ROUTER_REGIONS = ("mlp_norm", "moe/router", "moe/router_topk", "moe/router_aux_scores", "moe/router_aux_loss",
                  "moe/shared")
PREPROCESS_REGIONS = ("moe/preprocess",)
LAYER_PIECES = ("layer", "moe_layer")
ALL = "*"
"""Capture spec of the full-iteration graph: every op of every piece, no per-pass graph launch."""
# full_iteration: tokens, labels and position ids (int64) and the loss mask (float32) per token
# (core/full_cuda_graph.py StaticBufferLoader copies the GPT batch of megatron/training/utils.py get_batch)
FULL_ITERATION_BATCH_BYTES_PER_TOKEN = 8 + 8 + 8 + 4


def _graphs(piece: str, modules: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The graphs of one transformer-layer piece, each as the regions it captures."""
    moe = piece == "moe_layer"
    if not modules:
        return [ATTN_REGIONS + (MOE_REGIONS if moe else MLP_REGIONS)]
    graphs = []
    if "attn" in modules:
        graphs.append(ATTN_REGIONS)
    if not moe and "mlp" in modules:
        graphs.append(MLP_REGIONS)
    if moe and "moe" in modules:
        graphs.append(MOE_REGIONS)
    elif moe and "moe_router" in modules:
        graphs.append(ROUTER_REGIONS + (PREPROCESS_REGIONS if "moe_preprocess" in modules else ()))
    return graphs


def capture_spec(cuda_graphs: tuple[str, tuple[str, ...]]) -> str:
    """"" (nothing captured), ``ALL``, or per piece its graphs: "piece:r1,r2;r3|piece2:...". ``cuda_graphs``:
    (implementation, modules) as the rules resolved them (``Layout.cuda_graphs``)."""
    impl, modules = cuda_graphs
    if impl == "none":
        return ""
    if impl == "full_iteration":
        return ALL
    return "|".join(f"{piece}:" + ";".join(",".join(g) for g in _graphs(piece, modules)) for piece in LAYER_PIECES)


@functools.lru_cache(maxsize=64)
def captured_graphs(spec: str, piece: str) -> tuple[frozenset[str], ...] | None:
    """The graphs (region sets) capturing ops of ``piece`` under ``spec``; None = everything, one graph per
    step (full iteration); () = nothing."""
    if spec == ALL:
        return None
    for entry in spec.split("|") if spec else ():
        name, _, graphs = entry.partition(":")
        if name == piece:
            return tuple(frozenset(g.split(",")) for g in graphs.split(";") if g)
    return ()


def graph_of(op, graphs: tuple[frozenset[str], ...]) -> int | None:
    """Index of the graph that captures ``op`` (by region, or region/subregion), or None."""
    for i, regions in enumerate(graphs):
        if op.region in regions or (op.subregion and f"{op.region}/{op.subregion}" in regions):
            return i
    return None


def graph_static_bytes_per_layer(parallel: ParallelConfig, model: ModelSpec, piece: str, boundary_bytes: int,
                                 layers_in_chunk: int, cuda_graphs: tuple[str, tuple[str, ...]]) -> float:
    """Static graph buffers of ``layers_in_chunk`` layers of one chunk for one micro-batch in flight (see the
    module docstring); ``boundary_bytes``: a layer's input (= output) tensor; ``cuda_graphs``:
    ``Layout.cuda_graphs``."""
    impl, modules = cuda_graphs
    if impl in ("none", "full_iteration") or layers_in_chunk == 0:
        return 0.0
    graphs = _graphs(piece, modules)
    if impl == "local":
        return float(boundary_bytes) if not modules else 2.0 * boundary_bytes * len(graphs) * layers_in_chunk
    cp = parallel.context_parallel_size
    mask = parallel.micro_batch_size * (model.seq_length // cp) * model.seq_length  # bool: 1 byte
    per_layer = sum(2.0 * boundary_bytes + (mask if g[0] == ATTN_REGIONS[0] else 0) for g in graphs)
    return per_layer * layers_in_chunk


def full_iteration_batch_bytes(parallel: ParallelConfig, model: ModelSpec, layout: Layout) -> float:
    """The full-iteration graph's static data batches: all micro-batches of the step on this rank."""
    num_micro_batches = layout.num_micro_batches
    if layout.cuda_graphs[0] != "full_iteration":
        return 0.0
    tokens = parallel.micro_batch_size * model.seq_length // parallel.context_parallel_size
    return float(num_micro_batches * tokens * FULL_ITERATION_BATCH_BYTES_PER_TOKEN)


def graph_memory_notes(memory) -> tuple[str, ...]:
    """A report note naming the stage whose CUDA graphs keep the most static memory (none without graphs)."""
    peak = max(memory, key=lambda mem: mem.cuda_graph_bytes)
    if not peak.cuda_graph_bytes:
        return ()
    return (f"CUDA graphs keep {peak.cuda_graph_bytes / 2**30:.2f} GiB of static buffers on stage {peak.stage} "
            f"(in its total; docs/schedule_features.md)",)
