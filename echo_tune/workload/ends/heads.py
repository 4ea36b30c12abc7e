"""The pieces at the ends of the pipeline: the embedding (first stage) and the output layer (last).

Embedding: vocabulary-parallel word embedding over padded_vocab/tp rows (out-of-range ids masked,
then all-reduce over TP, or reduce-scatter to the sequence-parallel shard), + learned position
embedding, + dropout. Output: final norm, vocabulary-parallel output linear [h -> padded_vocab/tp]
(all-gathering the sequence under SP) and Megatron's vocabulary-parallel cross-entropy, whose three
small TP all-reduces (max logit, predicted logit, sum of exps; [s, b] fp32 each) are recorded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from echo_tune.workload.recording.comm import all_reduce, column_parallel_linear, reduce_output
from echo_tune.workload.recording.context import in_region
from echo_tune.workload.layers import Shard, norm, norm_params
from echo_tune.workload.ends.loss import fused_cross_entropy


def embedding_params(shard: Shard) -> dict[str, dict[str, torch.Tensor]]:
    m = shard.model
    params = {"word": shard.tensor(shard.vocab, m.hidden_size, grad=True)}
    if m.position_embedding_type == "learned_absolute":
        params["position"] = shard.tensor(m.position_table_rows, m.hidden_size, grad=True)
    return {"embedding": params}


def _embed(ids: torch.Tensor, position_ids: torch.Tensor, params: dict, shard: Shard) -> torch.Tensor:
    """ids [b, s/cp] (int64) -> hidden [s_in, b, h] on this rank (vocabulary range of TP rank 0)."""
    p = params["embedding"]
    outside = (ids < 0) | (ids >= shard.vocab)
    local_ids = ids.masked_fill(outside, 0)
    words = F.embedding(local_ids, p["word"])  # [b, s, h]
    words = words.masked_fill(outside.unsqueeze(-1), 0.0)
    words = words.transpose(0, 1).contiguous()  # [s, b, h]
    hidden = reduce_output(words, shard.tp, shard.sequence_parallel)
    if "position" in p:
        hidden = hidden + F.embedding(position_ids, p["position"]).unsqueeze(1)
    if shard.model.hidden_dropout > 0:
        hidden, _mask = torch.native_dropout(hidden, shard.model.hidden_dropout, True)
    return hidden


def embedding_forward(ids: torch.Tensor, position_ids: torch.Tensor, params: dict, shard: Shard) -> torch.Tensor:
    return in_region("embedding", _embed, ids, position_ids, params, shard)


def output_params(shard: Shard) -> dict[str, dict[str, torch.Tensor]]:
    """Final norm + this rank's rows of the output layer (a copy of the word embeddings when tied)."""
    return {"final_norm": norm_params(shard),
            "output": {"weight": shard.tensor(shard.vocab, shard.model.hidden_size, grad=True)}}


class _VocabParallelCrossEntropy(Function):
    """Megatron's ``_VocabParallelCrossEntropy``: fp32 logits [s, b, v/tp], labels [s, b] -> loss [s, b]."""

    @staticmethod
    def forward(ctx, logits, labels, tp):
        logits = logits.float()
        logits_max = all_reduce(logits.amax(dim=-1), "tp", tp)
        logits.sub_(logits_max.unsqueeze(-1))
        outside = (labels < 0) | (labels >= logits.shape[-1])
        local_labels = labels.masked_fill(outside, 0)
        predicted = torch.gather(logits, -1, local_labels.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        predicted = all_reduce(predicted, "tp", tp)
        exp_logits = logits.exp_()
        sum_exp = all_reduce(exp_logits.sum(dim=-1), "tp", tp)
        loss = torch.log(sum_exp) - predicted
        softmax = exp_logits.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local_labels)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, outside, local_labels = ctx.saved_tensors
        update = (~outside).to(softmax.dtype).unsqueeze(-1)
        grad = softmax.scatter_add_(-1, local_labels.unsqueeze(-1), -update)  # in place, as Megatron
        return grad.mul_(grad_loss.unsqueeze(-1)), None, None


def _output(x: torch.Tensor, labels: torch.Tensor, loss_mask: torch.Tensor, params: dict, shard: Shard):
    hidden = norm(x, params["final_norm"], shard)
    logits = column_parallel_linear(hidden, params["output"]["weight"], None, shard.tp, shard.sequence_parallel)
    if shard.model.cross_entropy_loss_fusion:  # fused kernels (workload/ends/loss.py)
        losses = fused_cross_entropy(logits, labels, shard.tp, shard.model.cross_entropy_fusion_impl)
    else:
        losses = _VocabParallelCrossEntropy.apply(logits, labels, shard.tp)
    return losses, (losses * loss_mask).sum()


def output_forward(x, labels, loss_mask, params: dict, shard: Shard):
    """Final norm -> logits -> per-token losses [s, b] (fp32) and the masked loss sum."""
    return in_region("output", _output, x, labels, loss_mask, params, shard)
