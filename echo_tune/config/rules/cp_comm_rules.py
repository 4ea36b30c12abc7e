"""How context parallelism communicates: ``--cp-comm-type`` and ``--hierarchical-context-parallel-sizes``.

Megatron-LM d98e8a64ddf3 hands the type to Transformer Engine's attention (core/extensions/transformer_engine.py
``TEDotProductAttention``; training/argument_utils.py passes a one-value list as that value), which runs
(TE d0067d0 pytorch/attention/dot_product_attention/context_parallel.py ``attn_forward_func_with_cp``):

- ``p2p``: ring attention, K/V chunks passed round the CP ring beside the attention kernels
  (``AttnFuncWithCPAndKVP2P``; workload/attention/core_attention.py);
- ``all_gather``: K and V all-gathered before attention, the exposed all-gather again in backward and dK/dV
  reduce-scattered (``AttnFuncWithCPAndKVAllGather``, "KV all-gather between CP ranks is exposed"; Llama 3,
  arXiv 2407.21783 section 3.3.2);
- ``a2a``: DeepSpeed-Ulysses: all-to-alls of q, k and v scatter the heads and gather the sequence, attention runs
  over the whole sequence with heads / CP, an all-to-all of the output scatters it back
  (``AttnFuncWithCPAndQKVOA2A``);
- ``a2a+p2p``: both, hierarchically: the all-to-alls inside the first level of
  ``--hierarchical-context-parallel-sizes`` (neighbouring CP ranks, parallel_state.py ``create_hierarchical_groups``),
  the ring over the second (``AttnFuncWithCPAndKVP2P`` with ``cp_group = [a2a group, p2p group]``).

workload/attention/cp_attention.py traces them. A per-layer list of different types is not modelled (refused by name).
"""

from __future__ import annotations

from math import prod

from echo_tune.config._checks import require
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.config.rules.expert_layout import placements

CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")
"""The values TE's ``attn_forward_func_with_cp`` runs (any other raises ``Unsupported communication type``)."""


def cp_comm_kind(parallel) -> str:
    """The one communication type of every layer (``--cp-comm-type`` repeated per layer with one value reads as it)."""
    kinds = set(str(parallel.cp_comm_type).split())
    if len(kinds) > 1:
        raise UnmodelledError(f"`--cp-comm-type {parallel.cp_comm_type}` (a different type per layer) is not modelled; "
                              f"give one type for every layer")
    return kinds.pop() if kinds else "p2p"


def a2a_size(parallel) -> int:
    """Ranks of the all-to-all: CP with a2a, the first hierarchical level with a2a+p2p, else 1."""
    kind = cp_comm_kind(parallel)
    if kind == "a2a":
        return parallel.context_parallel_size
    if kind == "a2a+p2p":
        return parallel.hierarchical_context_parallel_sizes[0]
    return 1


def resolved_cp_comm(parallel) -> tuple[str, int]:
    """(CP communication type, all-to-all ranks) of the layers' attention; p2p at CP 1 (what the Layout carries)."""
    if parallel.context_parallel_size == 1:
        return ("p2p", 1)
    return (cp_comm_kind(parallel), a2a_size(parallel))


def check_cp_comm(model, parallel) -> None:
    """Raise ConfigError for a CP communication setting Megatron-LM or TE rejects (UnmodelledError where not modelled)."""
    kind, cp, sizes = cp_comm_kind(parallel), parallel.context_parallel_size, parallel.hierarchical_context_parallel_sizes
    require(kind != "allgather", "`--cp-comm-type allgather` (the spelling of Megatron-LM's help text) is rejected by "
                                 "Transformer Engine's attention (`Unsupported communication type`); write all_gather")
    require(kind in CP_COMM_TYPES, f"`cp_comm_type` must be one of {', '.join(CP_COMM_TYPES)} (Transformer Engine's "
                                   f"context-parallel attention), but got (cp_comm_type={kind!r})")
    if sizes is not None:  # training/arguments.py validate_args
        require(prod(sizes) == cp, f"`prod(hierarchical_context_parallel_sizes) == context_parallel_size` must hold "
                                   f"(Megatron-LM validate_args), but got (hierarchical_context_parallel_sizes="
                                   f"{list(sizes)}, context_parallel_size={cp})")
    require(kind != "a2a+p2p" or sizes is not None,
            "--hierarchical-context-parallel-sizes must be set when a2a+p2p is used in cp comm (Megatron-LM "
            "validate_args); add it, e.g. --hierarchical-context-parallel-sizes 2 2 for CP 4")
    if kind == "a2a+p2p":  # TE: cp_group = [a2a group, p2p group]
        require(len(sizes) == 2, f"a2a+p2p runs two levels (Transformer Engine's cp_group = [a2a group, p2p group]), "
                                 f"but got (hierarchical_context_parallel_sizes={list(sizes)}); give two sizes")
    a2a = a2a_size(parallel) if cp > 1 else 1
    if a2a > 1:  # TE AttnFuncWithCPAndQKVOA2A / flash_attn_a2a_communicate: heads split over the all-to-all ranks
        tp = parallel.tensor_model_parallel_size
        for what, heads in (("num_attention_heads", model.num_attention_heads), ("num_query_groups", model.query_groups)):
            require(heads % (tp * a2a) == 0,
                    f"`{what} / tensor_model_parallel_size % (CP all-to-all size) == 0` must hold (Transformer Engine "
                    f"splits each rank's heads over the all-to-all), but got ({what}={heads}, "
                    f"tensor_model_parallel_size={tp}, all-to-all size={a2a}); change --cp-comm-type or the sizes")


def cp_groups(parallel, domain_gpus: int, group_cls) -> dict:
    """Placements of the all-to-all ("cp_a2a") and ring ("cp_p2p") levels of a2a+p2p: CP ranks sit next to each other
    inside TP's stride (rank order tp-cp-...), the all-to-all level innermost."""
    if cp_comm_kind(parallel) != "a2a+p2p" or parallel.context_parallel_size == 1:
        return {}
    a2a, p2p = parallel.hierarchical_context_parallel_sizes
    out = placements([("tp", parallel.tensor_model_parallel_size), ("cp_a2a", a2a), ("cp_p2p", p2p)], domain_gpus,
                     group_cls)
    return {"cp_a2a": out["cp_a2a"], "cp_p2p": out["cp_p2p"]}
