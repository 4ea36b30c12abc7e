"""A Megatron-Core MoE layer (the "moe" region), sharded as one rank holds it, on ``meta``.

Follows megatron/core/transformer/moe/ (moe_layer.py, router.py, token_dispatcher.py, experts.py,
shared_experts.py) at NVIDIA/Megatron-LM commit d98e8a64ddf3:

- router: a replicated [E, h] linear on this rank's tokens (in fp32/fp64 with ``--moe-router-dtype``),
  softmax and top-k over experts;
- shared expert (``--moe-shared-expert-intermediate-size``): a dense MLP sharded over TP like ``_mlp``;
- dispatchers (``workload/mlp/token_dispatch.py``): ``alltoall``: permute the top-k token copies by expert,
  all-to-all over EP, all-gather over ETP when ETP > 1, regroup by local expert, experts, then the reverse
  (restore the order, reduce-scatter over ETP, all-to-all, un-permute as a sum); ``flex`` (DeepEP / HybridEP): one
  dispatch and one combine call, each an all-to-all that permutes (sums) the copies inside its kernel, the
  probabilities sent with the tokens; DeepEP's received tokens are regrouped by local expert and back (a copy each),
  HybridEP's inside its calls; the cost layer times the all-to-alls with the flex kernels' de-duplicated traffic
  and own bandwidth (``cost/collectives/moe_dispatch.py``);
- ``--moe-apply-probs-on-input`` (top-1 only): the routing probability weights the permuted tokens before the
  dispatch instead of at the un-permute (experts.py);
- ``allgather`` dispatcher: all-gather the tokens over the ETP x EP group, each rank gathers the tokens
  of its local experts, experts, scatter back, reduce-scatter over the ETP x EP group;
- experts: this rank's E/EP experts with fc1 / fc2 sharded over ETP; ``--moe-grouped-gemm`` runs them as
  one batched GEMM, otherwise one GEMM per expert (SequentialMLP).

Routing assumption (stated in reports): tokens are balanced over experts, times ``moe_routing_imbalance``
for the busiest expert (whose rank sets the step: every rank waits for it at the combine all-to-all).
With ``--moe-expert-capacity-factor`` the busiest expert holds at most that capacity, and exactly it
with ``--moe-pad-expert-input-to-capacity``.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from echo_tune.workload.mlp.activations import activation, experts_quick_geglu
from echo_tune.workload.mlp.expert_padding import padded
from echo_tune.workload.recording.comm import column_parallel_linear, row_parallel_linear
from echo_tune.workload.recording.context import in_subregion
from echo_tune.workload.mlp.moe_comm import gather, scatter, token_rows
from echo_tune.workload.mlp.token_dispatch import (combine_alltoall, combine_flex, dispatch_alltoall, dispatch_flex,
                                                   local_experts, received_rows, scatter_add)
from echo_tune.workload.mlp.moe_router import SideGradient, route
from echo_tune.workload.mlp.dispatch_preprocess import alltoall_preprocess, runs_preprocess
from echo_tune.workload.mlp.flex_metadata import deepep_preprocess

ROUTER_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}


def moe_params(shard) -> dict[str, dict[str, torch.Tensor]]:
    """Router, this rank's local experts (sharded over ETP) and the shared expert (sharded over TP)."""
    m, n = shard.model, local_experts(shard)
    f = m.moe_ffn_size // shard.etp
    fc1_out = 2 * f if m.gated_linear_unit else f
    params = {"router": {"weight": shard.tensor(m.num_experts, m.hidden_size, grad=True),
                         **({"expert_bias": shard.tensor(m.num_experts, dtype=torch.float32)}  # a buffer
                            if m.moe_router_enable_expert_bias else {})},
              "experts": {"fc1": shard.tensor(n, m.hidden_size, fc1_out, grad=True),
                          "fc2": shard.tensor(n, f, m.hidden_size, grad=True)}}
    if m.add_bias_linear:  # router.py's bias and TE GroupedLinear's per-expert biases (see _expert_bias)
        params["router"]["bias"] = shard.tensor(m.num_experts, grad=True)
        params["experts"] |= {"fc1_bias": shard.tensor(n, fc1_out, grad=True),
                              "fc2_bias": shard.tensor(n, 1, m.hidden_size, grad=True)}
    if m.moe_shared_expert_intermediate_size:
        fs = m.moe_shared_expert_intermediate_size // shard.tp
        params["shared"] = {"fc1": shard.tensor(2 * fs if m.gated_linear_unit else fs, m.hidden_size, grad=True),
                            "fc2": shard.tensor(m.hidden_size, fs, grad=True)}
        if m.moe_shared_expert_gate:  # replicated over TP, as the router
            params["shared_gate"] = {"weight": shard.tensor(1, m.hidden_size, grad=True)}
    return params


def _activation(x, shard):
    """The experts' activation, as the dense MLP's (fused or unfused SwiGLU, GeLU, squared relu)."""
    return activation(x, None, shard.model)


def _router(tokens, params, shard):
    """Router logits, then the routing of workload/mlp/moe_router.py: (probabilities [T, k], indices [T, k])."""
    m, weight = shard.model, params["router"]["weight"]
    dtype = ROUTER_DTYPES.get(m.moe_router_dtype)
    if dtype is not None:
        tokens, weight = tokens.to(dtype), weight.to(dtype)
    logits = torch.matmul(tokens, weight.t())
    bias = params["router"].get("expert_bias")
    probs, indices = route(logits, m, bias)  # moe_router.py
    return probs.to(shard.dtype), indices


# The routing-probability weighting inside a fused weighted activation (Megatron-LM d98e8a64ddf3
# core/fusions/fused_bias_swiglu.py ``WeightedSwiGLUFunction.forward``: ``save_for_backward(input, weights)``, one
# kernel forward and one backward that also yields the probabilities' gradient): the activation's input is saved by
# the activation already, so only the probabilities [rows, 1] are kept, and the product runs inside the activation's
# own kernels (moe_router.SideGradient with no fill: a view forward; backward the gradient passes through and the
# probabilities' [rows, 1] gradient comes out of the activation's backward kernel, no kernel of its own).


def _weighted_act(hidden, shard, probs):
    m = shard.model
    fused = (m.swiglu and m.bias_swiglu_fusion) or (m.quick_geglu and (m.bias_gelu_fusion or m.use_transformer_engine_op_fuser))
    if m.quick_geglu and fused:  # the op fuser's ScaledClampedQGeGLU: one kernel, clamp inside
        act = experts_quick_geglu(hidden, m) if not m.use_transformer_engine_op_fuser else \
            torch.ops.echo_tune.quick_geglu(hidden, float(m.glu_linear_offset))
    else:
        act = _activation(hidden, shard)
    if probs is None:
        return act
    if fused:
        return SideGradient.apply(act, probs, None)
    # experts.py bias_act_func, unfused: ``intermediate_parallel * permuted_probs`` in the probabilities' dtype
    return (act * probs).to(act.dtype)


def _expert_act(hidden, shard, probs=None):
    """The experts' activation of fc1's output, as its own sub-region "expert_act" (nested in "experts"):
    what ``--recompute-modules moe_act`` replays (experts.py ``bias_act_func`` under
    ``CheckpointWithoutOutput``, Megatron-LM d98e8a64ddf3). fc1 is tagged first so the backward walk of
    the activation stops at fc1's node (``context.in_subregion``: parts in forward order).

    ``probs`` [rows, 1]: the permuted routing probabilities, which Megatron applies here, in the experts'
    activation (experts.py ``TEGroupedMLP.forward`` ``bias_act_func(fc1_output, bias, permuted_probs)``),
    not at the un-permute (token_dispatcher.py: every dispatcher's ``unpermute`` call passes no probs)."""
    return in_subregion("expert_act", _weighted_act, hidden, shard, probs)


class _PerExpertWeights(Function):
    """Megatron's SequentialMLP holds each expert's weights as parameters of their own: its weight-gradient GEMM
    writes each expert's gradient (into main_grad), with no kernel gathering them. Here one stacked tensor holds
    them (its size is what the rest counts), so the per-expert slices come from this view, whose backward launches
    nothing; slicing it with autograd's select would charge a zero-filled stacked gradient per expert and their
    sums (select_backward and add: the stacked weights' bytes times the local experts, twice)."""

    @staticmethod
    def forward(ctx, stacked):
        ctx.shape = stacked.shape
        return tuple(stacked.unbind(0))

    @staticmethod
    def backward(ctx, *grads):
        return grads[0].new_empty(ctx.shape)  # an allocation: the gradients are already in place


def _experts(x, params, shard, probs=None):
    """The local experts on their tokens x [M, h]: grouped (one batched GEMM) or one GEMM per expert;
    ``probs`` [M, 1] weight the activation (``_expert_act``)."""
    n, fc1, fc2 = local_experts(shard), params["experts"]["fc1"], params["experts"]["fc2"]
    rows = x.shape[0] // n  # a multiple of n by construction (received_rows)
    # the local spec always builds SequentialMLP (core/models/backends.py LocalSpecProvider.grouped_mlp_modules)
    if (shard.model.moe_grouped_gemm and not shard.model.local_spec) or n == 1:
        x, probs = in_subregion("expert_pad", _pad, x, probs)  # the FP8 alignment (expert_padding.py)
        hidden = in_subregion("experts", torch.bmm, x.view(n, rows, -1), fc1)
        weights = probs.view(n, rows, 1) if probs is not None else None
        out = in_subregion("experts", torch.bmm, _expert_act(hidden, shard, weights), fc2)  # tagged before the bias
        out = in_subregion("expert_bias", _expert_bias, out, params, shard, weights).reshape(rows * n, -1)
        return in_subregion("expert_pad", padded, out)
    # SequentialMLP (experts/experts.py): torch.split of the tokens by expert (its backward: one cat), one
    # expert's fc1 / fc2 after another, torch.cat of their outputs
    outs, tokens, fc1s, fc2s = [], x.split(rows), _PerExpertWeights.apply(fc1), _PerExpertWeights.apply(fc2)
    splits = probs.split(rows) if probs is not None else [None] * n
    for i in range(n):
        hidden = in_subregion("experts", torch.mm, tokens[i], fc1s[i])
        outs.append(torch.mm(_expert_act(hidden, shard, splits[i]), fc2s[i]))
    return torch.cat(outs)


def _pad(x, probs):
    """Fp8Padding of the tokens and of their probabilities (TEGroupedMLP.forward)."""
    return padded(x), (padded(probs) if probs is not None else None)


def _expert_bias(out, params, shard, probs):
    """fc2's per-expert bias, weighted by each copy's probability (Megatron-LM d98e8a64ddf3 moe/experts.py
    ``TEGroupedMLP._apply_bias``: fc2 is built with ``skip_bias_add`` and, on the eager path with host token
    counts, ``torch.cat([t + b * p for each local expert])``: two kernels per expert and a copy of the whole
    output), issued as bare PyTorch calls from Python (sub-region "expert_bias": cost/host/host_bound.py prices them
    as such). fc1's bias rides in TE GroupedLinear's GEMM epilogue (none traced); ``out`` [n, rows, h]."""
    bias = params["experts"].get("fc2_bias")
    if bias is None:
        return out
    if probs is None:  # probabilities applied on the input (top-1): Megatron passes ones
        probs = out.new_ones(out.shape[0], out.shape[1], 1)
    return torch.cat([t + b * p for t, b, p in zip(out.unbind(0), bias.unbind(0), probs.unbind(0))]).view(out.shape)


def _shared(x, params, shard):
    p = params["shared"]
    hidden = column_parallel_linear(x, p["fc1"], None, shard.tp, shard.sequence_parallel)
    return row_parallel_linear(_activation(hidden, shard), p["fc2"], shard.tp, shard.sequence_parallel)


def moe_forward(x: torch.Tensor, params: dict, shard) -> torch.Tensor:
    """One MoE MLP on this rank; ``x`` is the post-attention-norm hidden [seq_in, b, h].

    Each part runs as a sub-region of "moe" (``context.in_subregion``), in forward order: "router",
    "preprocess" (the dispatcher's metadata step), "dispatch", "experts" (Megatron's TE GroupedLinear / TE linears
    of SequentialMLP; their activation is "expert_act", see ``_expert_act``), "combine" and "shared" (a TE-linear
    MLP)."""
    m = shard.model
    s, b, h = x.shape
    tokens = x.reshape(s * b, h)
    probs, indices = in_subregion("router", _router, tokens, params, shard)
    recv = received_rows(s * b, shard)
    if runs_preprocess(m, shard):  # the dropless all-to-all's token counts, to the host (dispatch_preprocess.py)
        in_subregion("preprocess", alltoall_preprocess, tokens, shard)
    elif m.moe_dispatcher_kernel == "deepep":  # its setup_metadata (flex_metadata.py)
        in_subregion("preprocess", deepep_preprocess, tokens, shard)
    if m.moe_token_dispatcher_type == "alltoall":
        expert_in, expert_probs = in_subregion("dispatch", dispatch_alltoall, tokens, indices, recv, shard,
                                               probs, m.moe_apply_probs_on_input)
        expert_out = in_subregion("experts", _experts, expert_in, params, shard, expert_probs)
        out = in_subregion("combine", combine_alltoall, expert_out, tokens, indices, shard).view(s, b, h)
    elif m.moe_token_dispatcher_type == "flex":
        expert_in, expert_probs = in_subregion("dispatch", dispatch_flex, tokens, recv, shard, probs,
                                               m.moe_apply_probs_on_input)
        expert_out = in_subregion("experts", _experts, expert_in, params, shard, expert_probs)
        out = in_subregion("combine", combine_flex, expert_out, tokens, shard).view(s, b, h)
    else:  # allgather: every rank of the ETP x EP group sees all of the group's tokens
        group_size = shard.ep * shard.etp
        rows = torch.zeros(recv * shard.etp, dtype=torch.int64, device=x.device)
        gathered = in_subregion("dispatch", lambda t: gather(t, "tpep", group_size), tokens)
        rows = token_rows(rows, gathered.shape[0])
        expert_in = in_subregion("dispatch", lambda g: g.index_select(0, rows), gathered)
        expert_out = in_subregion("experts", _experts, expert_in, params, shard)
        out = in_subregion("combine", lambda g, e: scatter(scatter_add(g.new_zeros(g.shape), rows, e), "tpep",
                                                             group_size), gathered, expert_out).view(s, b, h)
    if "shared" in params:
        shared = in_subregion("shared", _shared, x, params, shard)
        if "shared_gate" in params:  # shared_experts.py: output * sigmoid(linear(hidden_states, gate_weight))
            shared = in_subregion("shared_gate", lambda o: o * torch.sigmoid(
                torch.nn.functional.linear(x, params["shared_gate"]["weight"])), shared)
        out = out + shared
    return out
