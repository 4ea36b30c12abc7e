"""Ex-situ tracing (as in Echo): run one rank's piece forward and backward on ``meta`` and record ops.

``TraceRecorder`` (workload/recording/recorder.py, with ``describe`` and ``SavedTensorMeter``) is a ``TorchDispatchMode``: every aten (or ``echo_tune::``) op that touches data
becomes an ``Op`` with its kind, phase, region, FLOPs, bytes and GEMM shape. Views and other
metadata-only ops (any op whose output aliases an input without writing it), allocations and
zero-byte ops are skipped. Collectives are recorded explicitly by ``comm.py`` / ``attention.py``
through ``context.record_collective``. Regions: see ``context.py`` (forward: ``in_region``; backward:
autograd-node pre-hooks re-enter the forward region of the node that runs).

Activation memory: a ``saved_tensors_hooks`` pack hook counts each saved tensor's storage once
(views share a storage), skipping parameters and buffers. ``activation_bytes_by_region`` charges a
storage to the region that first saves it; ``region_internal_bytes`` counts only storages created and
saved inside one region (what recomputing that region frees; see ``SavedTensorMeter``). Both, and
``region_created_bytes``, also carry "region/subregion" keys for tagged sub-regions (``context.in_subregion``,
e.g. "moe/expert_act" for ``--recompute-modules moe_act``), beside the region totals.

Kinds: "gemm" (mm / addmm / bmm / baddbmm, FLOPs from ``torch.utils.flop_counter``), "attention"
(``echo_tune::flash_attn`` and its backward, FLOPs from ``kernels.ATTENTION_FLOPS``), "memory"
(everything else that moves data: 1 FLOP per output element, bytes = inputs + outputs), and the
explicitly recorded "collective"s.

The public ``trace_*`` functions are cached on a canonical key (the model fields that change shapes
plus tp / cp / sp / micro-batch / precision), so a search traces each distinct shape once.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from echo_tune.config.specs.model import ModelSpec
from echo_tune.workload import layers
from echo_tune.workload.recording import context
from echo_tune.workload.ends import heads
from echo_tune.workload.graph import Trace
from echo_tune.workload.recording.recorder import SavedTensorMeter, TraceRecorder, tensor_bytes
from echo_tune.config.specs.linear_attention_fields import LinearAttentionFields

def _run(piece: str, forward, inputs: tuple, params: dict, *, region: str, tied_param_count: int = 0,
         expert_param_count: int = 0, linear_param_counts: dict[str, int] | None = None) -> Trace:
    """Trace ``forward(*inputs)`` and backward from its output (a tensor, or (output, loss))."""
    recorder = TraceRecorder(region)
    meter = SavedTensorMeter(recorder, layers.constants(params))
    with context.activate(recorder), recorder:
        with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
            result = forward(*inputs)
        meter.close()
        output, root = result if isinstance(result, tuple) else (result, result)
        grad = None if root.dim() == 0 else torch.empty_like(root)
        recorder.phase = "bwd"
        torch.autograd.backward(root, grad)
    return Trace(piece=piece, forward=tuple(recorder.ops["fwd"]), backward=tuple(recorder.ops["bwd"]),
                 activation_bytes=sum(meter.nbytes.values()), activation_bytes_by_region=meter.by_region(),
                 activation_bytes_by_part=meter.by_part(),
                 region_internal_bytes=meter.internal_by_region(), region_created_bytes=meter.created_by_region(),
                 input_bytes=tensor_bytes(inputs[0]), output_bytes=tensor_bytes(output),
                 param_count=sum(t.numel() for t in layers.parameters(params)), tied_param_count=tied_param_count,
                 param_tensors=layers.param_tensors(params, tied=bool(tied_param_count)),
                 expert_param_count=expert_param_count, linear_param_counts=linear_param_counts or {})


LAYER_PIECES = ("layer", "moe_layer", "window_layer", "moe_window_layer", "linear_layer", "moe_linear_layer")
"""Transformer-layer pieces: dense or MoE MLP; full or sliding-window attention, or the gated delta net."""


def _trace_piece(piece: str, shard: layers.Shard) -> Trace:
    s, b = shard.seq, shard.micro_batch_size
    if piece in LAYER_PIECES:
        params = layers.layer_params(shard)
        x = shard.tensor(*shard.hidden_shape(), grad=True)
        experts = sum(t.numel() for t in layers.expert_parameters(params))
        return _run(piece, lambda x: layers.layer_forward(x, params, shard), (x,), params, region="input_norm",
                    expert_param_count=experts, linear_param_counts=layers.linear_param_counts(params))
    if piece == "embedding":
        params = heads.embedding_params(shard)
        ids = shard.tensor(b, s, dtype=torch.int64)
        positions = shard.tensor(shard.seq_in, dtype=torch.int64)
        return _run("embedding", lambda i, p: heads.embedding_forward(i, p, params, shard), (ids, positions),
                    params, region="embedding")
    params = heads.output_params(shard)
    x = shard.tensor(*shard.hidden_shape(), grad=True)
    labels, mask = shard.tensor(s, b, dtype=torch.int64), shard.tensor(s, b, dtype=torch.float32)
    tied = 0 if shard.model.untie_embeddings_and_output_weights else params["output"]["weight"].numel()
    return _run("output", lambda x, y, m: heads.output_forward(x, y, m, params, shard), (x, labels, mask),
                params, region="output", tied_param_count=tied)


def _canonical(piece: str, model: ModelSpec) -> ModelSpec:
    """The model with every field that cannot change this piece's trace set to a fixed value."""
    fixed = dict(name="", num_layers=1, moe_layer_freq=1, num_query_groups=model.query_groups, kv_channels=model.head_dim,
                 ffn_hidden_size=model.ffn_size, hidden_dropout=0.1 if model.hidden_dropout > 0 else 0.0,
                 attention_dropout=0.1 if model.attention_dropout > 0 else 0.0,
                 attention_backend="auto", use_flash_attn=model.flash_attention)
    if not piece.startswith("moe_"):  # MoE settings shape only the MoE layers
        fixed.update(num_experts=None, moe_ffn_hidden_size=None, moe_shared_expert_intermediate_size=None)
        if model.quick_geglu:  # a dense MLP runs quick-GeGLU unfused only (layer_fields.py refuses it fused)
            fixed.update(bias_gelu_fusion=False)
    # the window shapes only the window pieces (which layers have it: layer_mix), the loss only the output
    fixed.update(window_attn_skip_freq=None)
    # the gated delta net's settings shape only its pieces (which layers: sim/schedule/linear_layers.py); one layer of it there
    if "linear" in piece:
        fixed.update(linear_attention_freq=2)
    else:
        fixed.update({f.name: f.default for f in dataclasses.fields(LinearAttentionFields)})
    if "window" not in piece:
        fixed.update(window_size=None)
    if piece != "output":
        fixed.update(cross_entropy_loss_fusion=False, cross_entropy_fusion_impl="native")
    if piece in LAYER_PIECES:
        fixed.update(vocab_size=1, make_vocab_size_divisible_by=1, untie_embeddings_and_output_weights=False)
    # --transformer-impl shapes only the layers (the local spec's norms and loss run the same kernels), and its
    # softmax flags only the local spec's attention (config/rules/local_spec.py)
    if piece not in LAYER_PIECES or not model.local_spec:
        fixed.update(masked_softmax_fusion=True, attention_softmax_in_fp32=False, apply_query_key_layer_scaling=False)
        if piece not in LAYER_PIECES:
            fixed.update(transformer_impl="transformer_engine", no_persist_layer_norm=False, use_flash_attn=True)
    return model.replace(**fixed)


@functools.lru_cache(maxsize=4096)
def _cached(piece: str, model: ModelSpec, tp: int, cp: int, sp: bool, mbs: int, precision: str,
            ep: int = 1, etp: int = 1, cp_comm: tuple[str, int] = ("p2p", 1), deterministic: bool = False) -> Trace:
    return _trace_piece(piece, layers.Shard(model, tp, cp, sp, mbs, precision, ep, etp, piece.startswith("moe_"),
                                            "window" in piece, cp_comm, "linear" in piece, deterministic))


def _trace(piece: str, model: ModelSpec, tp: int, cp: int, sp: bool, mbs: int, precision: str,
           ep: int = 1, etp: int = 1, cp_comm: tuple[str, int] = ("p2p", 1), deterministic: bool = False) -> Trace:
    if not piece.startswith("moe_"):
        ep = etp = 1
    if piece not in LAYER_PIECES or cp == 1 or "linear" in piece:
        cp_comm = ("p2p", 1)  # only the layers' self-attention talks across CP
    if "linear" not in piece:
        deterministic = False  # deterministic mode picks the gated delta net's path only (sim/features/determinism.py: the rest)
    return _cached(piece, _canonical(piece, model), tp, cp, bool(sp and tp > 1), mbs, precision, ep, etp,
                   tuple(cp_comm), deterministic)


def trace_moe_layer(model: ModelSpec, *, tensor_model_parallel_size: int, context_parallel_size: int = 1,
                    sequence_parallel: bool = False, micro_batch_size: int = 1, precision: str = "bf16",
                    expert_model_parallel_size: int = 1, expert_tensor_parallel_size: int = 1,
                    cp_comm: tuple[str, int] = ("p2p", 1)) -> Trace:
    """One transformer layer whose MLP is the MoE block, one micro-batch on one rank (cached by shape)."""
    return _trace("moe_layer", model, tensor_model_parallel_size, context_parallel_size, sequence_parallel,
                  micro_batch_size, precision, expert_model_parallel_size, expert_tensor_parallel_size, cp_comm)


def trace_window_layer(model: ModelSpec, *, tensor_model_parallel_size: int, context_parallel_size: int = 1,
                       sequence_parallel: bool = False, micro_batch_size: int = 1, precision: str = "bf16",
                       expert_model_parallel_size: int = 1, expert_tensor_parallel_size: int = 1,
                       moe: bool = False, cp_comm: tuple[str, int] = ("p2p", 1)) -> Trace:
    """A layer with sliding-window attention (``model.window_size``), dense or MoE (cached by shape)."""
    return _trace("moe_window_layer" if moe else "window_layer", model, tensor_model_parallel_size,
                  context_parallel_size, sequence_parallel, micro_batch_size, precision,
                  expert_model_parallel_size, expert_tensor_parallel_size, cp_comm)


def trace_linear_layer(model: ModelSpec, *, tensor_model_parallel_size: int, context_parallel_size: int = 1,
                       sequence_parallel: bool = False, micro_batch_size: int = 1, precision: str = "bf16",
                       expert_model_parallel_size: int = 1, expert_tensor_parallel_size: int = 1,
                       moe: bool = False, deterministic: bool = False) -> Trace:
    """A layer with the gated delta net in place of self-attention, dense or MoE (cached by shape);
    ``deterministic``: ``--deterministic-mode`` (the torch-native delta rule)."""
    return _trace("moe_linear_layer" if moe else "linear_layer", model, tensor_model_parallel_size,
                  context_parallel_size, sequence_parallel, micro_batch_size, precision,
                  expert_model_parallel_size, expert_tensor_parallel_size, deterministic=deterministic)


def trace_layer(model: ModelSpec, *, tensor_model_parallel_size: int, context_parallel_size: int = 1,
                sequence_parallel: bool = False, micro_batch_size: int = 1, precision: str = "bf16",
                cp_comm: tuple[str, int] = ("p2p", 1)) -> Trace:
    """One transformer layer of one micro-batch on one rank (cached by shape). ``cp_comm``: (CP communication type,
    all-to-all ranks), config/rules/cp_comm_rules.py."""
    return _trace("layer", model, tensor_model_parallel_size, context_parallel_size, sequence_parallel,
                  micro_batch_size, precision, cp_comm=cp_comm)


def trace_embedding(model: ModelSpec, *, tensor_model_parallel_size: int, context_parallel_size: int = 1,
                    sequence_parallel: bool = False, micro_batch_size: int = 1, precision: str = "bf16") -> Trace:
    """The input embedding (first pipeline stage) of one micro-batch on one rank (cached by shape)."""
    return _trace("embedding", model, tensor_model_parallel_size, context_parallel_size, sequence_parallel,
                  micro_batch_size, precision)


def trace_output(model: ModelSpec, *, tensor_model_parallel_size: int, context_parallel_size: int = 1,
                 sequence_parallel: bool = False, micro_batch_size: int = 1, precision: str = "bf16") -> Trace:
    """Final norm, output layer and loss (last pipeline stage) of one micro-batch on one rank (cached)."""
    return _trace("output", model, tensor_model_parallel_size, context_parallel_size, sequence_parallel,
                  micro_batch_size, precision)
