"""Muon's optimizer states per data-parallel rank: which whole tensors each rank of a stage updates.

Megatron-LM d98e8a64ddf3. ``--optimizer muon --use-distributed-optimizer`` (or ``dist_muon``) becomes
``use_layer_wise_distributed_optimizer`` and clears ``use_distributed_optimizer`` (training/arguments.py), and
``LayerWiseDistributedOptimizer`` (core/optimizer/layer_wise_optimizer.py) narrows every base optimizer's param
groups to the tensors its rank owns *before* ``Float16OptimizerWithFloat16Params`` makes their fp32 masters, so
a rank keeps master weights and states for its own tensors only, whole:

- with the layer-wise param layout (the default), DDP reduce-scatters into a shard-aligned buffer
  (training/models/dist_utils.py ``_ddp_wrap``): Muon's matrices are bin-packed over the data-parallel ranks by
  Newton-Schulz cost (``_compute_per_buffer_param_layout``) and the rest go to a byte-level
  ``DistributedOptimizer`` (core/optimizer/__init__.py): taken here as 1/DP of the stage's states each;
- with ``--no-use-layer-wise-param-layout`` DDP keeps ``use_distributed_optimizer`` off (gradients all-reduced,
  the gradient buffer whole) and ``_shard_params_ping_pong`` deals *all* the rank's tensors, Muon's and the
  scalar optimizer's alike, by size: sorted by element count (a stable sort of the Muon groups' tensors, then
  the scalar optimizer's, in model order: ``_get_param_groups`` sorts the groups without overrides first) and
  handed to ranks 0, 1, ..., D-1, D-1, ..., 0, 0, 1, ... (D = DP x CP; routed experts' tensors separately over
  the expert-data-parallel group, their groups being ``is_expert_parallel``). The largest tensor, the word
  embeddings, lands on one rank with its Adam states (12 bytes per element): ranks differ, by hundreds of MiB
  on small models and by tens of GiB on large ones.

Megatron logs memory from the last rank (training/global_vars.py ``_set_tensorboard_writer``: rank
world_size - 1), which is the last of its data-parallel and expert-data-parallel groups (rank order
tp-cp-ep-dp-pp). ``optimizer_bytes`` returns that rank's bytes and the most a rank of the stage holds
(dense and expert maxima added: a bound, as which expert-DP rank pairs with which DP rank is not followed).
"""

from __future__ import annotations

from echo_tune.config.specs.layout import Layout
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.workload.graph import Trace

MATRIX_KINDS = ("matrix", "expert")
"""``Trace.param_tensors`` kinds that Muon updates (is_managed_by_layer_wise_optimizer: 2-D, not embedding)."""
STATE_BYTES = {"muon": 4.0, "adam": 8.0, "lion": 4.0}
"""fp32 states per element besides the master weight: Muon's momentum; Adam's exp_avg and exp_avg_sq; Lion's
exp_avg (NVIDIA-NeMo/Emerging-Optimizers, torch.optim.Adam)."""


def state_bytes(parallel: ParallelConfig, kind: str) -> float:
    """Optimizer bytes per element of a tensor of ``kind``: the fp32 master (none for fp32 training, where
    ``FP32Optimizer`` updates the parameter itself) and the optimizer's states."""
    master = 0.0 if parallel.precision == "fp32" else 4.0
    return master + STATE_BYTES["muon" if kind in MATRIX_KINDS else parallel.muon_scalar_optimizer]


def mtp_tensors(hidden_size: int, tp: int) -> tuple[tuple[int, str], ...]:
    """One MTP layer's tensors besides its transformer layer: the eh projection [2h -> h], sharded over TP (2-D,
    so Muon's), and its two norms (multi_token_prediction.py; simulate.py counts the same 2h^2/tp + 2h)."""
    return (2 * hidden_size * hidden_size // tp, "matrix"), (hidden_size, "other"), (hidden_size, "other")


def stage_tensors(pieces: dict[str, Trace], contents, chunk_mix, mtp_tensors=()) -> list[tuple[int, str]]:
    """The trainable tensors of one rank of a stage, chunk by chunk in model order (``Trace.param_tensors``):
    ``contents`` and ``chunk_mix`` are the stage's ``Layout.chunk_contents`` and (dense, MoE) layers per chunk;
    the output layer's tied copy is dropped where the stage also holds the word embeddings (counted once, as
    simulate.py's ``_stage_tails``); ``mtp_tensors``: one MTP layer's projection and norms."""
    holds_embedding = any(c.embedding for c in contents)
    out = []
    for chunk, (dense, moe) in zip(contents, chunk_mix):
        if chunk.embedding:
            out += pieces["embedding"].param_tensors
        out += list(pieces["layer"].param_tensors) * dense
        out += list(pieces["moe_layer"].param_tensors) * moe if moe else []
        out += list(mtp_tensors) * chunk.mtp_layers
        if chunk.loss:
            out += [t for t in pieces["output"].param_tensors if not (t[1] == "tied" and holds_embedding)]
    return out


def ping_pong(numels: list[int], ranks: int) -> list[list[int]]:
    """Indices of ``numels`` each rank gets from ``_shard_params_ping_pong``: a stable sort by size, then ranks
    0..D-1, D-1..0, 0.. in turn."""
    loop = list(range(ranks)) + list(range(ranks))[::-1]
    owned = [[] for _ in range(ranks)]
    for turn, index in enumerate(sorted(range(len(numels)), key=lambda i: numels[i])):
        owned[loop[turn % len(loop)]].append(index)
    return owned


def _per_rank_bytes(parallel: ParallelConfig, tensors: list[tuple[int, str]], ranks: int) -> list[float]:
    """Optimizer bytes of each of ``ranks`` ranks dealt ``tensors`` ping-pong (Muon's groups first)."""
    ordered = [t for t in tensors if t[1] in MATRIX_KINDS] + [t for t in tensors if t[1] not in MATRIX_KINDS]
    owned = ping_pong([n for n, _ in ordered], ranks)
    return [sum(ordered[i][0] * state_bytes(parallel, ordered[i][1]) for i in mine) for mine in owned]


def optimizer_bytes(parallel: ParallelConfig, layout: Layout, tensors: list[tuple[int, str]]) -> tuple[float, float]:
    """(the stage's last rank's, its most loaded rank's) Muon optimizer bytes: masters and states of ``tensors``
    (``stage_tensors``) as the layer-wise distributed optimizer divides them (module docstring)."""
    dense = [t for t in tensors if t[1] != "expert"]
    experts = [t for t in tensors if t[1] == "expert"]
    dp, edp = layout.data_parallel_size * parallel.context_parallel_size, layout.expert_data_parallel_size
    if not parallel.use_distributed_optimizer:
        dp = edp = 1
    if parallel.use_layer_wise_param_layout or (dp == 1 and edp == 1):
        total = (sum(n * state_bytes(parallel, k) for n, k in dense) / dp
                 + sum(n * state_bytes(parallel, k) for n, k in experts) / edp)
        return total, total
    dense_ranks = _per_rank_bytes(parallel, dense, dp) if dense else [0.0]
    expert_ranks = _per_rank_bytes(parallel, experts, edp) if experts else [0.0]
    return dense_ranks[-1] + expert_ranks[-1], max(dense_ranks) + max(expert_ranks)


def spread_notes(memory) -> tuple[str, ...]:
    """A report note naming the stage whose data-parallel ranks differ most (none when they hold the same)."""
    widest = max(memory, key=lambda mem: mem.dp_spread_bytes)
    if not widest.dp_spread_bytes:
        return ()
    return (f"Muon's layer-wise distributed optimizer without its param layout deals whole tensors to data-parallel "
            f"ranks: on stage {widest.stage} the most loaded rank holds {widest.dp_spread_bytes / 2**30:.2f} GiB "
            f"more optimizer state than the last rank shown (the fit check takes it; sim/data_parallel/muon_shards.py)",)
