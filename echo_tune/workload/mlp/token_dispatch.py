"""How a Megatron-Core MoE layer moves its tokens to the experts and back, on one rank (``workload/mlp/moe.py``).

Megatron-LM d98e8a64ddf3 moe/token_dispatcher.py: the ``alltoall`` dispatcher (permute the top-k copies by expert,
all-to-all over EP, all-gather over ETP, regroup by local expert; the reverse, then un-permute as a plain sum) and
the ``flex`` dispatcher (DeepEP / HybridEP: one dispatch and one combine call each way that permute and sum inside
their kernels), with the routing assumption (balanced, times ``moe_routing_imbalance`` for the busiest expert,
capped by the capacity)."""

from __future__ import annotations

import math

import torch
from torch.autograd import Function

from echo_tune.workload.mlp.flex_metadata import (deepep_layout, deepep_multihot, hybridep_counts,
                                                   hybridep_preprocess)
from echo_tune.workload.mlp.moe_comm import AllToAll, gather, received, scatter, token_rows
from echo_tune.workload.recording import kernels
from echo_tune.workload.recording.context import in_subregion


def local_experts(shard) -> int:
    return shard.model.num_experts // shard.ep


def busiest_share(model) -> float:
    """Tokens of the busiest expert relative to a balanced share (see the module docstring)."""
    capacity, share = model.moe_expert_capacity_factor, model.moe_effective_imbalance  # 1 when force-balanced
    if capacity is None:
        return share
    return capacity if model.moe_pad_expert_input_to_capacity else min(share, capacity)


def received_rows(tokens: int, shard) -> int:
    """Token copies that reach this rank's experts before the ETP gather: balanced x the busiest share,
    rounded up to whole local experts."""
    n = local_experts(shard)
    return max(1, math.ceil(tokens * shard.model.moe_router_topk * busiest_share(shard.model) / n)) * n


class _SortChunks(Function):
    """Megatron's regrouping of the received tokens (and their probabilities) by local expert, and its reverse
    before the combine (token_dispatcher.py ``dispatch_postprocess`` / ``combine_preprocess``:
    ``sort_chunks_by_idxs``, TE's ``moe_sort_chunks_by_index(_with_probs)`` under ``--moe-permute-fusion``; with
    drop-and-pad a ``transpose().contiguous()``; NVIDIA/Megatron-LM d98e8a64ddf3), only where this rank holds more
    than one expert: a copy forward, and a copy of the gradient backward (TE's backward sorts by the inverse index;
    unfused, ``torch.split``'s backward concatenates)."""

    @staticmethod
    def forward(ctx, *tensors):
        return tuple(t.clone() for t in tensors)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(None if g is None else g.clone() for g in grads)


def _sort_chunks(shard, *tensors):
    return _SortChunks.apply(*tensors) if local_experts(shard) > 1 else tensors


def _received(rows, recv: int, shard):
    """All-to-all over EP, all-gather over ETP."""
    return gather(AllToAll.apply(rows, "ep", shard.ep, recv), "etp", shard.etp)


def _returned(rows, sent: int, shard):
    """The reverse of ``_received``: reduce-scatter over ETP, all-to-all back over EP into ``sent`` rows."""
    return AllToAll.apply(scatter(rows, "etp", shard.etp), "ep", shard.ep, sent)


def dispatch_alltoall(tokens, indices, recv: int, shard, probs, on_input: bool):
    """Permute the top-k copies by expert and send them to their experts; with them the permuted
    probabilities (token_dispatcher.py ``MoEAlltoAllTokenDispatcher``: ``permute(..., probs=probs)`` and
    the probs' own all-to-all), then regroup both by local expert: (expert input, their probabilities [M, 1], or
    None when applied here)."""
    rows = token_rows(indices.reshape(-1), tokens.shape[0])
    permuted = torch.ops.echo_tune.fused_permute(tokens, rows) if shard.model.moe_permute_fusion \
        else tokens.index_select(0, rows)  # [T*k, h], by expert
    if on_input:  # --moe-apply-probs-on-input: weight the copies before the experts
        (expert_in,) = _sort_chunks(shard, _received(permuted * probs.reshape(-1, 1), recv, shard))
        return expert_in, None
    return _sort_chunks(shard, _received(permuted, recv, shard), _received(probs.reshape(-1, 1), recv, shard))


class _InKernel(Function):
    """Rows the flex dispatcher's kernels move inside their dispatch / combine call, with no kernel of their own: the
    permutation into per-destination copies and the sum of the returned copies (fused_a2a.py; DeepEP's and
    HybridEP's dispatch / combine kernels). ``received`` gives an empty buffer when tracing (no kernel), the data
    when run for real."""

    @staticmethod
    def forward(ctx, x, rows):
        ctx.rows = x.shape[0]
        return received(x, rows)

    @staticmethod
    def backward(ctx, grad):
        return received(grad, ctx.rows), None


def _local_permute(shard, *tensors):
    """DeepEP's received tokens regrouped by local expert, and back before the combine: a copy each way, as
    ``_SortChunks`` (Megatron's ``permute`` / ``unpermute``: ``_DeepepManager.get_permuted_hidden_states_by_experts``
    / ``get_restored_hidden_states_by_experts``). HybridEP's ``dispatch_with_permute`` runs its permute kernel
    where its plain ``dispatch`` copies the received tokens out of the communication buffer ("dispatch =
    dispatch_kernel + permute_kernel" against "dispatch_kernel + d2d", deepseek-ai/DeepEP hybrid-ep
    ``tests/test_hybrid_ep.py``), and the bandwidths echo-tune times it with were measured through that plain call
    (``cost/data/flex-dispatch-nvlink.yaml``): no copy of its own."""
    return _SortChunks.apply(*tensors) if shard.model.moe_flex_dispatcher_backend == "deepep" else tensors


def dispatch_flex(tokens, recv: int, shard, probs, on_input: bool):
    """The flex dispatcher (token_dispatcher.py ``MoEFlexTokenDispatcher``, Megatron-LM d98e8a64ddf3): one
    dispatch call sends the tokens with their probabilities, permuted inside the kernel; the all-to-all is timed
    from its de-duplicated traffic (``cost/collectives/moe_dispatch.py``)."""
    kernel = shard.model.moe_dispatcher_kernel
    if not on_input and shard.model.moe_router_dtype not in ("fp32", "fp64"):
        # both take float32 probabilities only: ``self.token_probs.float()`` (and its gradient cast back)
        probs = in_subregion("dispatch_metadata", lambda p: p.float(), probs)
    if kernel == "deepep":
        in_subregion("dispatch_metadata", deepep_layout, tokens, shard)  # flex_metadata.py
    elif kernel == "hybridep":
        in_subregion("dispatch_metadata", hybridep_preprocess, tokens, shard)
    copies = _InKernel.apply(tokens, tokens.shape[0] * shard.model.moe_router_topk)
    if on_input:  # --moe-apply-probs-on-input (top-1): weighted before the dispatch
        received_rows = _received(copies * probs.reshape(-1, 1), recv, shard)
        _after_dispatch(kernel, tokens, recv, shard)
        (expert_in,) = _local_permute(shard, received_rows)
        return expert_in, None
    expert_probs = _InKernel.apply(probs.reshape(-1, 1), recv * shard.etp)  # sent with the tokens
    received_rows = _received(copies, recv, shard)
    _after_dispatch(kernel, tokens, recv, shard)
    return _local_permute(shard, received_rows, expert_probs)


def _after_dispatch(kernel: str, tokens, recv: int, shard) -> None:
    """What Megatron runs on the returned metadata before the experts (flex_metadata.py): DeepEP's per-expert map,
    HybridEP's token counts (dropless); sub-region "dispatch_metadata" of the dispatch, which TE's permute fusion
    does not touch (cost/kernels/moe_fusion.py folds "dispatch" alone)."""
    if kernel == "deepep":
        in_subregion("dispatch_metadata", deepep_multihot, tokens, recv * shard.etp, shard)
    elif shard.model.moe_expert_capacity_factor is None:
        in_subregion("dispatch_metadata", hybridep_counts, tokens, shard)


def combine_flex(expert_out, tokens, shard):
    """Back through DeepEP's un-permutation (a copy) or straight into HybridEP's combine, one call that sums each
    token's returned copies."""
    (restored,) = _local_permute(shard, expert_out)
    back = _returned(restored, tokens.shape[0] * shard.model.moe_router_topk, shard)
    return _InKernel.apply(back, tokens.shape[0])


def combine_alltoall(expert_out, tokens, indices, shard):
    """Restore the order by source rank (a copy), reduce-scatter over ETP, all-to-all back, un-permute: a plain
    sum of the copies, already weighted by the experts (token_dispatcher.py ``combine_postprocess`` calls
    ``unpermute`` without probs)."""
    flat = token_rows(indices.reshape(-1), tokens.shape[0])
    (restored,) = _sort_chunks(shard, expert_out)
    back = _returned(restored, flat.shape[0], shard)
    if shard.model.moe_permute_fusion:
        return torch.ops.echo_tune.fused_unpermute(back, flat, tokens.shape[0])
    return scatter_add(tokens.new_zeros(tokens.shape), flat, back)


class _UnpermuteSum(Function):
    """Megatron's unfused un-permute sum (moe_utils.py ``unpermute``, Megatron-LM d98e8a64ddf3: ``scatter_add_``
    over the expanded index, or ``index_add_`` under deterministic algorithms; TE's fused one is
    ``fused_unpermute`` below): traced as one ``index_add`` forward and one ``index_select`` of the gradient
    backward, saving only the index. Autograd's own ``index_add`` would also save ``src``, a [T*k, h] copy
    Megatron does not keep."""

    @staticmethod
    def forward(ctx, out, index, src):
        ctx.save_for_backward(index)
        return out.index_add(0, index, src)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        return grad, None, grad.index_select(0, index)


def scatter_add(out, index, src):
    return _UnpermuteSum.apply(out, index, src)


# TE's fused permutation (``--moe-permute-fusion``: moe_utils.py ``permute`` / ``unpermute`` with fused=True ->
# transformer_engine.pytorch.permutation ``moe_permute_with_probs`` / ``moe_unpermute``, TE d0067d0da6cb): the permute
# reads each token once and writes its k copies, the un-permute reads the copies and writes each token's sum once;
# each one kernel, the backward of each the other. Unfused, Megatron gathers the copies (``index_select``: a row read
# per copy) and sums them with ``scatter_add`` into zeros (``_UnpermuteSum`` above).
fused_permute = kernels._define("fused_permute", "(Tensor x, Tensor index) -> Tensor",
                                lambda x, index: x.new_empty((index.shape[0], *x.shape[1:])))
fused_unpermute = kernels._define("fused_unpermute", "(Tensor x, Tensor index, int rows) -> Tensor",
                                  lambda x, index, rows: x.new_empty((rows, *x.shape[1:])))


def _permute_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])
    ctx.rows = inputs[0].shape[0]


def _permute_backward(ctx, dy):
    (index,) = ctx.saved_tensors
    return torch.ops.echo_tune.fused_unpermute(dy, index, ctx.rows), None


def _unpermute_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])


def _unpermute_backward(ctx, dy):
    (index,) = ctx.saved_tensors
    return torch.ops.echo_tune.fused_permute(dy, index), None, None


fused_permute.register_autograd(_permute_backward, setup_context=_permute_setup)
fused_unpermute.register_autograd(_unpermute_backward, setup_context=_unpermute_setup)
fused_permute.register_kernel(("cpu", "cuda"), lambda x, index: x.index_select(0, index))
fused_unpermute.register_kernel(("cpu", "cuda"),
                                lambda x, index, rows: x.new_zeros((rows, *x.shape[1:])).index_add(0, index, x))

