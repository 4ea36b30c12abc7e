"""The layouts a practitioner would try first (the largest TP inside a node with each pipeline depth, common
settings), which a sampling search simulates before its sampler proposes any (search/engines/sampling_run.py)."""

from __future__ import annotations

from echo_tune.search.space.layouts import Candidate
from echo_tune.search.space.search_space import SearchSpace


# how much each setting's value is preferred, per field: lower first
_PREFERENCE = {
    "num_gpus": lambda v: -v,
    "context_parallel_size": lambda v: v,
    "expert_model_parallel_size": lambda v: -v,
    "expert_tensor_parallel_size": lambda v: 0 if v is None else v,
    "decoder_first_pipeline_num_layers": lambda v: v is not None,
    "decoder_last_pipeline_num_layers": lambda v: v is not None,
    "account_for_embedding_in_pipeline_split": lambda v: bool(v),
    "account_for_loss_in_pipeline_split": lambda v: bool(v),
    "micro_batch_size": lambda v: v,
    "virtual_pipeline_model_parallel_size": lambda v: 0 if v is None else v,
    "num_layers_per_virtual_pipeline_stage": lambda v: v is not None,
    "sequence_parallel": lambda v: not v,
    "tp_comm_overlap": lambda v: bool(v),
    "recompute_granularity": lambda v: {"selective": 0, None: 1, "full": 2}[v],
    "recompute_method": lambda v: {"uniform": 0, "block": 1, None: 2}[v],
    "recompute_num_layers": lambda v: 0 if v is None else v,
    "use_distributed_optimizer": lambda v: not v,
    "overlap_param_gather": lambda v: not v,
    "overlap_grad_reduce": lambda v: not v,
    "fp8_format": lambda v: v is None,
    "fp8_param_gather": lambda v: not v,
}


def _preference_key(c: Candidate) -> tuple:
    cfg = c.config
    return tuple(rank(cfg[f]) for f, rank in _PREFERENCE.items())


def baselines(space: SearchSpace, valid: list[Candidate], limit: int = 6) -> list[Candidate]:
    """The obvious first tries: the largest TP inside a node with each pipeline depth, common settings.

    Spread over the pipeline depths when there are more than ``limit``.
    """
    node = space.cluster.gpus_per_node
    in_node = [c for c in valid if c.parallel.tensor_model_parallel_size <= node] or valid
    tp = max(c.parallel.tensor_model_parallel_size for c in in_node)
    best_per_pp: dict[int, Candidate] = {}
    for c in sorted((c for c in in_node if c.parallel.tensor_model_parallel_size == tp), key=_preference_key):
        best_per_pp.setdefault(c.parallel.pipeline_model_parallel_size, c)
    picks = [best_per_pp[p] for p in sorted(best_per_pp)]
    if len(picks) > limit:
        step = (len(picks) - 1) / (limit - 1)
        picks = [picks[round(i * step)] for i in range(limit)]
    return picks
