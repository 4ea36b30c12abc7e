"""Ex-situ tracing (as in Echo): run one rank's piece forward and backward on ``meta`` and record ops.

``TraceRecorder`` is a ``TorchDispatchMode``: every aten (or ``echo_tune::``) op that touches data
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
import weakref
from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from echo_tune.config.specs.model import ModelSpec
from echo_tune.workload import layers
from echo_tune.workload.recording import context
from echo_tune.workload.ends import heads
from echo_tune.workload.graph import Op, Trace
from echo_tune.workload.recording.kernels import ATTENTION_CAUSAL_ARG, ATTENTION_EXPS, ATTENTION_FLOPS
from echo_tune.workload.recording.opkey import op_key
from echo_tune.config.specs.linear_attention_fields import LinearAttentionFields

aten = torch.ops.aten
GEMMS = (aten.mm, aten.addmm, aten.bmm, aten.baddbmm)
ALLOCATIONS = (aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided)
GATHERS = (aten.embedding, aten.gather, aten.index_select)
"""Ops that read only the gathered rows of their first input, not all of it."""
METADATA = (aten.detach, aten.alias, aten.lift_fresh, aten._unsafe_view, aten.view, aten.t, aten.transpose,
            aten.expand, aten.as_strided)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _aliases_input(func, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> bool:
    """True for views: an output shares an input's storage and the op writes nothing."""
    if func._schema.is_mutable:
        return False
    storages = {t.untyped_storage()._cdata for t in inputs}
    return any(t.untyped_storage()._cdata in storages for t in outputs)


def _gemm_mnk(packet, args) -> tuple[int, int, int]:
    """(m, n, k) of a matmul-like op, with any batch dimension folded into m."""
    a, b = (args[0], args[1]) if packet in (aten.mm, aten.bmm) else (args[1], args[2])
    if a.dim() == 3:
        return a.shape[0] * a.shape[1], b.shape[2], a.shape[2]
    return a.shape[0], b.shape[1], a.shape[1]


def describe(func, args, kwargs, out, *, phase: str, region: str, subregion: str = "") -> Op | None:
    """The ``Op`` for one dispatched call, or None when it moves no data."""
    packet = func.overloadpacket
    if packet in ALLOCATIONS or packet in METADATA:
        return None
    inputs, outputs = _tensors((args, kwargs)), _tensors(out)
    if _aliases_input(func, inputs, outputs):
        return None
    nbytes = sum(map(_nbytes, inputs)) + sum(map(_nbytes, outputs))
    if packet in GATHERS:  # the table is read only where indexed: as many bytes as the output
        nbytes += sum(map(_nbytes, outputs)) - _nbytes(args[0])
    if nbytes == 0:
        return None
    common = dict(name=str(packet), phase=phase, region=region, subregion=subregion, bytes=float(nbytes), key=op_key(func, args, kwargs))
    if packet in GEMMS:
        flops = flop_registry[packet](*args, **kwargs, out_val=out)
        a = args[0] if packet in (aten.mm, aten.bmm) else args[1]
        return Op(kind="gemm", flops=float(flops), gemm_mnk=_gemm_mnk(packet, args),
                  gemm_groups=int(a.shape[0]) if a.dim() == 3 else 1, **common)
    if packet in ATTENTION_FLOPS:
        return Op(kind="attention", flops=float(ATTENTION_FLOPS[packet](args)), exps=ATTENTION_EXPS[packet](args),
                  causal=bool(args[ATTENTION_CAUSAL_ARG[packet]]), **common)
    return Op(kind="memory", flops=float(sum(t.numel() for t in outputs)), **common)


class TraceRecorder(TorchDispatchMode):
    """Records dispatched ops (and, via ``add_collective``, collectives) per phase and region."""

    def __init__(self, region: str) -> None:
        super().__init__()
        self.phase = "fwd"
        self.region = region
        self.subregion = ""
        self.ops: dict[str, list[Op]] = {"fwd": [], "bwd": []}
        self.tagged_nodes: set = set()
        self.created_in: dict[int, str] = {}
        """Storage id -> the forward region whose op first wrote it."""
        self.created_in_part: dict[int, str] = {}
        """Storage id -> the forward "region/subregion" whose op first wrote it (tagged sub-regions only)."""

    @property
    def part(self) -> str | None:
        """The current "region/subregion", or None outside a tagged sub-region."""
        return f"{self.region}/{self.subregion}" if self.subregion else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.phase == "fwd":
            self._note_new_storages(args, kwargs, out)
        op = describe(func, args, kwargs, out, phase=self.phase, region=self.region, subregion=self.subregion)
        if op is not None:
            self.ops[self.phase].append(op)
        return out

    def _note_new_storages(self, args, kwargs, out) -> None:
        """Remember the region of each freshly allocated output storage (ids of freed ones get reused)."""
        inputs = {t.untyped_storage()._cdata for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            key = t.untyped_storage()._cdata
            if key not in inputs:
                self.created_in[key] = self.region
                if self.part is not None:
                    self.created_in_part[key] = self.part
                else:
                    self.created_in_part.pop(key, None)

    def add_collective(self, name: str, group: str, size_bytes: int) -> None:
        self.ops[self.phase].append(Op(name=name, kind="collective", phase=self.phase, region=self.region,
                                       subregion=self.subregion,
                                       collective=name, group=group, size_bytes=size_bytes))


class SavedTensorMeter:
    """Pack hook that sums the storages saved for backward, once each, excluding ``constants``.

    What counts is what the autograd graph still holds when the forward ends (``close``): a tensor saved by a
    branch whose graph was dropped is freed with it, and its storage's address (the key) may go to a storage
    allocated later. Taking a key's first save at pack time instead counted the freed storage and not the later
    one, and which addresses were reused changed from one process to the next (a DeepSeek-V3 MoE layer's bytes
    came out 955.3 to 957.3 MiB).

    ``by_region``: each storage is charged to the region that first saves it. ``internal_by_region``:
    only storages created in a region and saved by that region alone, i.e. what recomputing the
    region frees (a region's inputs and outputs are kept by the recompute checkpoint or by the
    neighbour that saves them).
    """

    def __init__(self, recorder: TraceRecorder, constants: list[torch.Tensor]) -> None:
        self.recorder = recorder
        self.skip = {t.untyped_storage()._cdata for t in constants}
        self.saves: list[tuple] = []
        """(weak reference to the saved tensor, storage key, its bytes, region, part) in save order."""
        self.nbytes: dict[int, int] = {}
        self.savers: dict[int, list[str]] = defaultdict(list)
        self.part_savers: dict[int, list[str | None]] = defaultdict(list)

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        """Keep a detached view (the same storage and version counter): the graph node holding ``t`` itself would
        hold ``t``'s own grad_fn, a cycle through C++ the collector cannot see, so a dropped branch never went."""
        saved = t.detach()
        storage = saved.untyped_storage()
        if storage._cdata not in self.skip:
            self.saves.append((weakref.ref(saved), storage._cdata, storage.nbytes(), self.recorder.region,
                               self.recorder.part))
        return saved

    def close(self) -> None:
        """At the end of the forward: the storages of the saved tensors still alive, once each, with their savers."""
        for ref, key, nbytes, region, part in self.saves:
            if ref() is not None:
                self.nbytes.setdefault(key, nbytes)
                self.savers[key].append(region)
                self.part_savers[key].append(part)
        self.saves.clear()

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def by_region(self) -> dict[str, int]:
        totals: dict[str, int] = defaultdict(int)
        for key, nbytes in self.nbytes.items():
            totals[self.savers[key][0]] += nbytes
        return dict(totals)

    def by_part(self) -> dict[str, int]:
        """Like ``by_region``, charged to the first saver's "region/subregion" where the region tags parts."""
        totals: dict[str, int] = defaultdict(int)
        for key, nbytes in self.nbytes.items():
            region, part = self.savers[key][0], self.part_savers[key][0]
            totals[part or region] += nbytes
        return dict(totals)

    def created_by_region(self) -> dict[str, int]:
        """By region, and by "region/subregion" for the tagged sub-regions (keys of both kinds)."""
        totals: dict[str, int] = defaultdict(int)
        for key, nbytes in self.nbytes.items():
            for creator in (self.recorder.created_in.get(key), self.recorder.created_in_part.get(key)):
                if creator is not None:
                    totals[creator] += nbytes
        return dict(totals)

    def internal_by_region(self) -> dict[str, int]:
        """By region, and by "region/subregion" for the tagged sub-regions (keys of both kinds)."""
        totals: dict[str, int] = defaultdict(int)
        for key, nbytes in self.nbytes.items():
            creator = self.recorder.created_in.get(key)
            if set(self.savers[key]) == {creator}:
                totals[creator] += nbytes
            part = self.recorder.created_in_part.get(key)
            if part is not None and set(self.part_savers[key]) == {part}:
                totals[part] += nbytes
        return dict(totals)


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
                 input_bytes=_nbytes(inputs[0]), output_bytes=_nbytes(output),
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
