"""The real parameters and inputs of one pipeline stage, built by the same functions the tracer uses.

``RealShard`` is the tracer's ``Shard`` with real tensors: ``layers.layer_params``,
``heads.embedding_params`` and ``heads.output_params`` (and whatever layer kinds land later, as long
as they build their tensors through ``shard.tensor``) then create them on the local device. Floats
are N(0, 0.02^2) (Megatron's ``--init-method-std`` default), indices zero, masks one. MoE layers
(``model.moe_pattern`` over the chunk's global layers, as ``sim/schedule/layer_mix.py`` counts them) get the MoE
shard (``moe=True``, the layout's EP and ETP): their MLP is the tracer's MoE block (``emulate/moe.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch.utils.checkpoint import checkpoint

import echo_tune.workload.recording.kernels_real  # noqa: F401  (real echo_tune:: kernels)
from echo_tune.config.rules.compatibility import Layout
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.workload import layers
from echo_tune.workload.ends import heads
from echo_tune.workload.layers import Shard

INIT_STD = 0.02
"""Megatron-LM's ``init_method_std`` default (megatron/core/transformer/transformer_config.py, commit
d98e8a64ddf3)."""


@dataclass(frozen=True)
class RealShard(Shard):
    """A ``Shard`` whose tensors live on a real device."""

    device: str = "cpu"

    def tensor(self, *shape: int, dtype: torch.dtype | None = None, grad: bool = False) -> torch.Tensor:
        dtype = dtype or self.dtype
        if self.device == "meta":
            return torch.empty(shape, dtype=dtype, device="meta", requires_grad=grad)
        if dtype.is_floating_point:
            t = (torch.randn(shape, dtype=torch.float32, device=self.device) * INIT_STD).to(dtype)
        else:
            t = torch.zeros(shape, dtype=dtype, device=self.device)
        return t.requires_grad_(grad)


@dataclass(kw_only=True)
class Chunk:
    """One model chunk of the stage: its layers' parameters and the end pieces it holds."""

    layers: list[dict]
    shards: list[RealShard]
    """Each layer's shard: the dense one, or the MoE one for an MoE layer."""
    embedding: dict | None = None
    output: dict | None = None

    def parameters(self) -> list[torch.Tensor]:
        params = [t for p in self.layers for t in layers.parameters(p)]
        for piece in (self.embedding, self.output):
            if piece is not None:
                params += layers.parameters(piece)
        return params


@dataclass(kw_only=True)
class Stage:
    shard: RealShard
    chunks: list[Chunk]
    ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    received: torch.Tensor
    """An activation as received from the previous stage (each micro-batch gets a fresh leaf of it)."""
    received_grad: torch.Tensor
    """A gradient as received from the next stage."""
    params: list[torch.Tensor] = field(default_factory=list)
    recompute: tuple[str, int] | None = None
    """Full activation recompute: (``recompute_method``, ``recompute_num_layers``), else None."""
    moe: bool = False
    """The stage holds MoE layers."""


def unit_norms(params: dict) -> None:
    """Norm weights start at one and biases at zero, as Megatron initialises them."""
    with torch.no_grad():
        for name, group in params.items():
            if not name.endswith("norm"):
                continue
            for key, tensor in group.items():  # weight / bias; a QK norm holds q and k weights (--qk-layernorm)
                tensor.zero_() if key == "bias" else tensor.fill_(1.0)


def build_stage(model: ModelSpec, parallel: ParallelConfig, layout: Layout, stage: int, device: str,
                seed: int = 0) -> Stage:
    """Real parameters of every chunk of ``stage`` and the inputs its micro-batches need."""
    torch.manual_seed(seed)
    shard = RealShard(model, parallel.tensor_model_parallel_size, parallel.context_parallel_size,
                      layout.sequence_parallel, parallel.micro_batch_size, parallel.precision, device=device)
    moe_shard = dataclasses.replace(shard, ep=parallel.expert_model_parallel_size, etp=parallel.expert_tensor_size,
                                    moe=True) if model.is_moe else shard
    pattern = model.moe_pattern if model.is_moe else ()
    chunks = []
    for contents in layout.chunk_contents[stage]:
        span = range(contents.first_layer, contents.first_layer + contents.layers)
        shards = [moe_shard if pattern and pattern[i] else shard for i in span]
        chunk = Chunk(layers=[layers.layer_params(s) for s in shards], shards=shards)
        if contents.embedding:
            chunk.embedding = heads.embedding_params(shard)
        if contents.loss:
            chunk.output = heads.output_params(shard)
        chunks.append(chunk)
    for chunk in chunks:
        for params in chunk.layers + [chunk.output or {}]:
            unit_norms(params)
    s, b = shard.seq, shard.micro_batch_size
    return Stage(shard=shard, chunks=chunks, ids=shard.tensor(b, s, dtype=torch.int64),
                 position_ids=torch.arange(shard.seq_in, device=device),
                 labels=shard.tensor(s, b, dtype=torch.int64),
                 loss_mask=torch.ones(s, b, dtype=torch.float32, device=device),
                 received=shard.tensor(*shard.hidden_shape()), received_grad=shard.tensor(*shard.hidden_shape()),
                 params=[t for chunk in chunks for t in chunk.parameters()],
                 moe=any(s.moe for chunk in chunks for s in chunk.shards),
                 recompute=(layout.recompute_method, layout.recompute_num_layers)
                 if layout.recompute_granularity == "full" else None)


def _run_layers(h: torch.Tensor, group: list[tuple[dict, RealShard]]) -> torch.Tensor:
    for params, shard in group:
        h = layers.layer_forward(h, params, shard)
    return h


def _layers_forward(h, chunk_layers: list[tuple[dict, RealShard]], recompute) -> torch.Tensor:
    """The chunk's layers, with Megatron's full recompute: ``uniform`` checkpoints the input of each
    group of ``recompute_num_layers`` layers (all layers are recomputed), ``block`` checkpoints the
    first ``recompute_num_layers`` layers one by one (Megatron-LM megatron/core/recompute.py, commit
    d98e8a64ddf3)."""
    if recompute is None:
        return _run_layers(h, chunk_layers)
    method, n = recompute
    if method == "uniform":
        for i in range(0, len(chunk_layers), n):
            h = checkpoint(_run_layers, h, chunk_layers[i:i + n], use_reentrant=False)
        return h
    for i, (params, shard) in enumerate(chunk_layers):
        h = checkpoint(_run_layers, h, [(params, shard)], use_reentrant=False) if i < n else \
            layers.layer_forward(h, params, shard)
    return h


def chunk_forward(stage: Stage, c: int, x: torch.Tensor | None) -> torch.Tensor:
    """Forward of chunk ``c`` for one micro-batch: the hidden output, or the loss on the last chunk."""
    chunk, shard = stage.chunks[c], stage.shard
    h = heads.embedding_forward(stage.ids, stage.position_ids, chunk.embedding, shard) if chunk.embedding else x
    h = _layers_forward(h, list(zip(chunk.layers, chunk.shards)), stage.recompute)
    if chunk.output is not None:
        return heads.output_forward(h, stage.labels, stage.loss_mask, chunk.output, shard)[1]
    return h
