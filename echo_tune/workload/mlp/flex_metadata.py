"""The flex dispatcher's kernels around DeepEP's and HybridEP's calls, as Megatron-Core runs them.

Megatron-LM d98e8a64ddf3 moe/token_dispatcher.py (the calls themselves, dispatch and combine, are the traced
all-to-alls of token_dispatch.py; what the libraries run inside them is their own). Both take float32 probabilities
only: with a router in bf16 the dispatch casts them first (``self.token_probs.float()``; token_dispatch.py).

- DeepEP (``_DeepepManager``): ``setup_metadata`` turns the [tokens, experts] probabilities into top-k indices
  (``torch.topk``, in ``dispatch_preprocess``, which ``--cuda-graph-modules moe_preprocess`` captures); the dispatch
  first asks DeepEP for the layout (fused_a2a.py ``buffer.get_dispatch_layout``: one kernel); after it,
  ``get_permuted_hidden_states_by_experts`` turns the received top-k indices into a [rows, local experts] map and
  probabilities: with ``--enable-experimental`` and ``--moe-permute-fusion`` one kernel
  (``fused_indices_to_multihot``), else ``_indices_to_multihot``: two zero fills, the mask of valid indices, the
  valid indices (``indices[mask]``: a nonzero whose size the host waits for), the count per row, an ``arange``
  repeated by those counts (``repeat_interleave``: its output size read on the host, a second wait), two index-puts
  and the valid probabilities (``probs[mask]``: a third wait), and a cast of the map to bool.
- HybridEP (``_HybridEPManager.dispatch``, dropless): the tokens per expert the dispatch returns, cast to int64 and
  summed for the combine's buffer (two kernels). Inside its dispatch call, before the dispatch kernel, HybridEP's
  ``metadata_preprocessing`` all-gathers the [tokens, experts] routing map over the EP group
  (``Executor::allgather_routing_map``: ``torch.distributed.all_gather_into_tensor``) and runs its scan and
  permute-preprocessing kernels on it (deepseek-ai/DeepEP hybrid-ep ``csrc/hybrid_ep``; its design note: "allgather_
  routing_map -> scan kernel -> permute_preprocessing -> dispatch kernel").

The host waits are ``HOST_READ_OP`` ops (cost/host/host_bound.py): the queue empties there, as at the dispatcher's
own synchronisation. Sizes: DeepEP's received rows taken as the received token copies (an upper bound; these kernels
are launch-bound either way). Not traced: the backward of the index-puts (the probabilities' gradient through the
map, a gather).
"""

from __future__ import annotations

import torch

from echo_tune.workload.mlp.moe_comm import gather
from echo_tune.workload.recording import kernels


def _metadata_kernel(name: str, schema: str, outputs):
    """``echo_tune::name``, a metadata kernel whose outputs are ``outputs(*args)``: (tensor on the device, shape, dtype)
    each; left empty when tracing, zeros when run for real (``emulate``)."""
    def impl(make):
        def run(*args):
            made = tuple(make(like, shape, dtype) for like, shape, dtype in outputs(*args))
            return made if len(made) > 1 else made[0]
        return run
    op = kernels._define(name, schema, impl(lambda like, shape, dtype: like.new_empty(shape, dtype=dtype)))
    op.register_kernel(("cpu", "cuda"),
                       impl(lambda like, shape, dtype: torch.zeros(shape, dtype=dtype, device=like.device)))
    return op


_metadata_kernel("deepep_dispatch_layout", "(Tensor topk_idx, int ranks, int experts) -> (Tensor, Tensor, Tensor)",
                 lambda idx, ranks, experts: ((idx, (idx.shape[0], ranks), torch.bool), (idx, (ranks,), torch.int32),
                                              (idx, (experts,), torch.int32)))
_metadata_kernel("fused_indices_to_multihot", "(Tensor idx, Tensor probs, int local) -> (Tensor, Tensor)",
                 lambda idx, probs, local: ((idx, (idx.shape[0], local), torch.bool),
                                            (idx, (idx.shape[0], local), probs.dtype)))
_metadata_kernel("hybridep_scan", "(Tensor global_map, int local) -> Tensor",
                 lambda m, local: ((m, (m.shape[0],), torch.int32),))
_metadata_kernel("hybridep_permute_preprocess", "(Tensor scan, int local) -> Tensor",
                 lambda scan, local: ((scan, (local,), torch.int32),))
# a kernel whose output size the host reads before it goes on (a nonzero, ``repeat_interleave``'s total): HOST_READ_OP
_metadata_kernel("host_reads", "(Tensor x, int n) -> Tensor", lambda x, n: ((x, (n,), torch.int64),))


def deepep_preprocess(tokens: torch.Tensor, shard) -> None:
    """``_DeepepManager.setup_metadata``: the top-k of the [tokens, experts] probabilities."""
    m = shard.model
    probs = tokens.new_empty((tokens.shape[0], m.num_experts), dtype=torch.float32)
    with torch.no_grad():
        torch.topk(probs, m.moe_router_topk, dim=-1)


def deepep_layout(tokens: torch.Tensor, shard) -> None:
    """fused_a2a.py ``get_dispatch_layout``: tokens per rank and expert, and which ranks each token goes to."""
    m = shard.model
    indices = tokens.new_empty((tokens.shape[0], m.moe_router_topk), dtype=torch.int64)
    with torch.no_grad():
        torch.ops.echo_tune.deepep_dispatch_layout(indices, shard.ep, m.num_experts)


def deepep_multihot(like: torch.Tensor, rows: int, shard) -> None:
    """``get_permuted_hidden_states_by_experts``' map of the ``rows`` received tokens' top-k indices (``like``: a
    tensor on the device)."""
    m = shard.model
    local, k = m.num_experts // shard.ep, m.moe_router_topk
    indices = like.new_empty((rows, k), dtype=torch.int64)
    probs = like.new_empty((rows, k), dtype=torch.float32)
    with torch.no_grad():
        if m.enable_experimental and m.moe_permute_fusion:
            torch.ops.echo_tune.fused_indices_to_multihot(indices, probs, local)
            return
        routing = torch.zeros((rows, local), dtype=torch.int64, device=like.device)
        weights = torch.zeros((rows, local), dtype=torch.float32, device=like.device)
        mask = indices != -1
        valid = torch.ops.echo_tune.host_reads(mask, rows)  # indices[mask]: nonzero, its size read on the host
        columns = indices.reshape(-1).index_select(0, valid)
        counts = mask.sum(dim=1)
        torch.ops.echo_tune.host_reads(counts, rows)  # repeat_interleave's output size
        row_ids = torch.repeat_interleave(torch.arange(rows, device=like.device), counts, output_size=rows)
        routing.index_put_((row_ids, columns), routing.new_empty(()))  # = 1
        kept = probs.reshape(-1).index_select(0, torch.ops.echo_tune.host_reads(mask, rows))  # probs[mask]
        weights.index_put_((row_ids, columns), kept)
        routing.bool()


def hybridep_counts(tokens: torch.Tensor, shard) -> None:
    """``_HybridEPManager.dispatch``: the returned tokens per local expert, as int64, and their sum."""
    local = shard.model.num_experts // shard.ep
    counts = tokens.new_empty((local,), dtype=torch.int32)
    with torch.no_grad():
        counts.to(torch.int64).sum()


def hybridep_preprocess(tokens: torch.Tensor, shard) -> None:
    """HybridEP's ``metadata_preprocessing`` inside its dispatch call: the routing map gathered over EP, then its
    scan and permute-preprocessing kernels."""
    m = shard.model
    local = m.num_experts // shard.ep
    routing_map = tokens.new_empty((tokens.shape[0], m.num_experts), dtype=torch.bool)
    with torch.no_grad():
        global_map = gather(routing_map, "ep", shard.ep)
        torch.ops.echo_tune.hybridep_permute_preprocess(torch.ops.echo_tune.hybridep_scan(global_map, local), local)
