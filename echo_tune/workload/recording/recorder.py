"""Recording one piece's ops and saved tensors: ``describe`` (one dispatched call as an ``Op``), ``TraceRecorder``
(the ``TorchDispatchMode`` that records every op that moves data, and the explicit collectives) and
``SavedTensorMeter`` (the storages the autograd graph holds when the forward ends). What they record and how it is
counted: workload/tracer.py's docstring, which runs them.
"""

from __future__ import annotations

import weakref
from collections import defaultdict
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from echo_tune.workload.graph import Op
from echo_tune.workload.recording.kernels import ATTENTION_CAUSAL_ARG, ATTENTION_EXPS, ATTENTION_FLOPS
from echo_tune.workload.recording.opkey import op_key

aten = torch.ops.aten
GEMMS = (aten.mm, aten.addmm, aten.bmm, aten.baddbmm)
ALLOCATIONS = (aten.empty, aten.empty_like, aten.empty_strided, aten.new_empty, aten.new_empty_strided)
GATHERS = (aten.embedding, aten.gather, aten.index_select)
"""Ops that read only the gathered rows of their first input, not all of it."""
METADATA = (aten.detach, aten.alias, aten.lift_fresh, aten._unsafe_view, aten.view, aten.t, aten.transpose,
            aten.expand, aten.as_strided)


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def tensor_bytes(t: torch.Tensor) -> int:
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
    nbytes = sum(map(tensor_bytes, inputs)) + sum(map(tensor_bytes, outputs))
    if packet in GATHERS:  # the table is read only where indexed: as many bytes as the output
        nbytes += sum(map(tensor_bytes, outputs)) - tensor_bytes(args[0])
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
