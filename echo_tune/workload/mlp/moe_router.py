"""The MoE router as Megatron-Core's TopKRouter runs it (megatron/core/transformer/moe/router.py, moe_utils.py at
NVIDIA/Megatron-LM d98e8a64ddf3), on [tokens, experts] logits:

- z-loss (``--moe-z-loss-coeff``): logsumexp of the logits, squared and averaged, its gradient attached to the logits
  (``MoEAuxLossAutoScaler``: the loss's backward runs into the router);
- scores (``topk_routing_with_score_function``): softmax, or sigmoid (DeepSeek-V3) / sqrt(softplus), whose chosen
  scores are gathered and renormalised for k > 1; group-limited routing (``--moe-router-num-groups``) first keeps the
  best groups (the sum of each group's top two scores, top groups, a mask); an expert bias
  (``--moe-router-enable-expert-bias``) is added to the scores the top-k compares; a scaling factor multiplies the
  chosen probabilities;
- the load-balancing loss where a coefficient is above 0 (``compute_routing_scores_for_aux_loss`` and
  ``switch_load_balancing_loss_func``): scores computed again over all experts, their top-k as a routing map, the
  tokens per expert and the summed scores, multiplied and summed, attached to the probabilities;
- the expert bias's tokens-per-expert count (no gradient).
- ``--moe-router-force-load-balancing`` (every benchmark recipe): the logits replaced by random ones
  (moe_utils.py ``apply_random_logits``: ``logits.clone().normal_()`` forward, the gradient straight through).
With ``--moe-router-fusion`` TE runs three of these chains as one kernel each (moe_utils.py ``fused=True``:
``topk_routing_with_score_function``, ``compute_routing_scores_for_aux_loss``, ``switch_load_balancing_loss_func``),
traced here as the nested sub-regions ``workload.graph.ROUTER_FUSED_CHAINS`` that cost/kernels/moe_fusion.py folds;
the rest stays PyTorch kernels in "router" whether fused or not: the random logits, the z-loss, the aux loss's
tokens-per-expert count (``get_tokens_per_expert_and_token_count``), its logged copy (router.py ``attach_and_log_load_balancing_loss``: the
loss over its coefficient; moe_logging.py ``record``: an add into the layer's slot and a copy) and the expert
bias's count. Counted in Megatron's own code (``benchmarks/megatron_host_ops.py``, EP 8, aux loss, forced balancing):
25 forward / 13 backward router kernels, 18 / 8 of them inside the three fused chains, so 10 / 8 with the fusion
(NVIDIA's DeepSeek-V3 account, Megatron-LM docs/discussions/deepseek-v3-gb200-optimization: "reducing the total
number of kernels in the router part from 72 to 31"). Not traced: the aux loss's small all-reduce of tokens per
expert over TP x CP, and the bias update after the optimizer step.
"""

from __future__ import annotations

import torch
from torch.autograd import Function

from echo_tune.workload.recording.context import in_subregion, tag_current


class SideGradient(Function):
    """Returns ``x`` (a view: no kernel); backward passes ``x``'s gradient through and gives ``side`` a gradient
    filled with ``fill`` (one fill kernel). ``fill`` 1: ``MoEAuxLossAutoScaler`` attaching a loss to a tensor (the
    loss's backward runs into the router); None: a tensor whose use, and its gradient, sit inside another op's
    kernels (moe.py: no kernel of its own; zeros when run for real)."""

    @staticmethod
    def forward(ctx, x, side, fill):
        ctx.save_for_backward(side)
        ctx.fill = fill
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        (side,) = ctx.saved_tensors
        if ctx.fill is None:  # computed inside another op's kernel: an allocation when tracing
            return grad, (torch.empty_like(side) if side.device.type == "meta" else torch.zeros_like(side)), None
        return grad, torch.full_like(side, ctx.fill), None


def _attach_loss(x: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
    return SideGradient.apply(x, loss, 1.0)


class _RandomLogits(Function):
    """moe_utils.py ``RandomSTE``: random logits forward (a copy and a random fill), the gradient straight through."""

    @staticmethod
    def forward(ctx, logits):
        return logits.clone().normal_()

    @staticmethod
    def backward(ctx, grad):
        return grad


def _logged(loss: torch.Tensor) -> None:
    """The loss as Megatron logs it per layer: over its coefficient (a division), added into the tracker's slot and
    copied (moe_logging.py ``record``): three small kernels, no gradient."""
    with torch.no_grad():
        value = loss.detach() / 1.0
        slot = value.new_empty(())
        slot.copy_(value)
        slot.add_(value)


def _scores(logits: torch.Tensor, function: str) -> torch.Tensor:
    if function == "sigmoid":
        return torch.sigmoid(logits)
    if function == "sqrtsoftplus":
        return torch.sqrt(torch.nn.functional.softplus(logits))
    return torch.softmax(logits, dim=-1)


def _group_limited(scores: torch.Tensor, k: int, groups: int, group_topk: int) -> torch.Tensor:
    """moe_utils.py ``group_limited_topk``: the scores outside the chosen groups masked out."""
    t, e = scores.shape
    group_scores = scores.view(t, groups, e // groups).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(t, groups, e // groups).reshape(t, e)
    return scores.masked_fill(~score_mask.bool(), float("-inf"))


def _topk(logits: torch.Tensor, model, expert_bias: torch.Tensor | None):
    """moe_utils.py ``topk_routing_with_score_function``: (probabilities [T, k], expert indices [T, k])."""
    k, function = model.moe_router_topk, model.moe_router_score_function
    scores = _scores(logits, function)
    ranked = scores + expert_bias if expert_bias is not None else scores
    if model.moe_router_num_groups and model.moe_router_group_topk:
        ranked = _group_limited(ranked, k, model.moe_router_num_groups, model.moe_router_group_topk)
    probs, indices = torch.topk(ranked, k, dim=-1)
    if function != "softmax" or ranked is not scores:
        probs = scores.gather(1, indices)  # the chosen scores without the bias / mask
    if function != "softmax" and k > 1:
        probs = probs / (probs.sum(dim=-1, keepdim=True) + 1e-20)
    if model.moe_router_topk_scaling_factor:
        probs = probs * model.moe_router_topk_scaling_factor
    return probs, indices


def _aux_scores(logits: torch.Tensor, model):
    """moe_utils.py ``compute_routing_scores_for_aux_loss``: (routing map [T, E], scores [T, E]) over all experts."""
    aux_scores = _scores(logits, model.moe_router_score_function)
    aux_map = torch.zeros_like(aux_scores).scatter(1, torch.topk(aux_scores, model.moe_router_topk, dim=-1)[1], 1.0)
    return aux_map, aux_scores


def _aux_loss(tokens_per_expert: torch.Tensor, aux_scores: torch.Tensor) -> torch.Tensor:
    """moe_utils.py ``switch_load_balancing_loss_func``: the summed scores times the tokens per expert, summed."""
    return (tokens_per_expert * aux_scores.sum(dim=0)).sum()


def route(logits: torch.Tensor, model, expert_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities [T, k], expert indices [T, k]) of [T, E] router logits, with the losses attached;
    ``expert_bias``: the router's [E] bias buffer (with ``--moe-router-enable-expert-bias``). Runs inside the
    "router" sub-region; the chains TE fuses run as their own nested sub-regions
    (``workload.graph.ROUTER_FUSED_CHAINS``)."""
    if model.moe_router_force_load_balancing:
        logits = _RandomLogits.apply(logits)
    if model.moe_z_loss_coeff is not None:
        z = torch.logsumexp(logits, dim=-1)
        logits = _attach_loss(logits, (z * z).mean())
    tag_current(logits)  # the gating GEMM, random logits and z-loss stay "router" in backward
    probs, indices = in_subregion("router_topk", _topk, logits, model, expert_bias)
    if model.moe_aux_loss_enabled:
        aux_map, aux_scores = in_subregion("router_aux_scores", _aux_scores, logits, model)
        tokens_per_expert = aux_map.sum(dim=0)  # get_tokens_per_expert_and_token_count
        loss = in_subregion("router_aux_loss", _aux_loss, tokens_per_expert, aux_scores)
        _logged(loss)
        probs = _attach_loss(probs, loss)
    if expert_bias is not None:
        with torch.no_grad():
            torch.zeros_like(logits).scatter(1, indices, 1.0).sum(dim=0)  # tokens per expert for the bias update
    return probs, indices
