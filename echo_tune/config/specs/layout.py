"""The checked spec: what ``check_compatible`` (config/rules/compatibility.py) derives from a valid (model, cluster,
GPU count, layout) and the simulator reads instead of asking the rule files again.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.specs.pipeline_layout import ChunkContents


@dataclass(frozen=True, kw_only=True)
class GroupPlacement:
    """Where one process group's ranks sit: ``ranks_per_node`` members share a node, over ``num_nodes`` nodes."""

    size: int
    ranks_per_node: int
    num_nodes: int
    num_leaves: int = 1
    """Leaf switches the group's nodes hang from (ClusterSpec ``nodes_per_leaf``); 1 = one leaf or a flat fabric."""
    spine_oversubscription: float = 1.0
    """Oversubscription of the spine level a group spanning several leaves crosses (ClusterSpec key)."""

    @property
    def crosses_nodes(self) -> bool:
        return self.num_nodes > 1


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Derived values of a valid (model, cluster, num_gpus, parallel) combination."""

    num_gpus: int
    data_parallel_size: int
    num_micro_batches: int
    virtual_pipeline_size: int
    stage_chunk_layers: tuple[tuple[int, ...], ...]
    """Layers of each model chunk on each pipeline stage: ``stage_chunk_layers[stage][chunk]``."""
    chunk_contents: tuple[tuple[ChunkContents, ...], ...]
    """What each chunk holds (decoder layers, embedding, loss, MTP): ``chunk_contents[stage][chunk]``."""
    schedule: str
    """"none" (no pipelining), "1f1b" or "interleaved"."""
    sequence_parallel: bool
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    recompute_regions: tuple[str, ...] = ("core_attention",)
    """Traced regions that selective recompute replays (``--recompute-modules``)."""
    recompute_discarding_regions: tuple[str, ...] = ()
    """Of those, the ones whose outputs are discarded too (output-discarding checkpointing)."""
    groups: dict[str, GroupPlacement]
    """tp, cp, dp, pp and the expert groups ep, etp, tpep (ETP x EP) and edp (expert data parallel)."""
    p2p_scatter_gather: bool = False
    """A pipeline send carries 1/TP of the activation, all-gathered by the receiver
    (``scatter_gather_tensors_in_pipeline`` without sequence parallelism at TP > 1)."""

    cuda_graphs: tuple[str, tuple[str, ...]] = ("none", ())
    """(implementation, captured modules) of CUDA graphs as Megatron resolves the flags; () modules = the whole
    layer (config/rules/schedule_rules.py ``cuda_graph_setting``)."""
    tp_comm_overlap: bool = False
    """``--tp-comm-overlap`` is on and its userbuffers reach the TE linears (schedule_rules ``userbuffer_overlap``)."""
    notes: tuple[str, ...] = ()
    """What the rules say of settings they accept but simulate otherwise than asked (userbuffers with MLA)."""
    cp_comm: tuple[str, int] = ("p2p", 1)
    """(CP communication type, all-to-all ranks) of the layers' attention, p2p at CP 1 (config/rules/cp_comm_rules.py
    ``resolved_cp_comm``)."""

    @property
    def expert_data_parallel_size(self) -> int:
        return self.groups["edp"].size

    @property
    def stage_layers(self) -> tuple[int, ...]:
        return tuple(sum(chunks) for chunks in self.stage_chunk_layers)

    def holder(self, what: str) -> tuple[int, int]:
        """(stage, chunk) holding the ``embedding`` or the ``loss`` (with the output layer)."""
        return next((s, c) for s, row in enumerate(self.chunk_contents) for c, x in enumerate(row)
                    if getattr(x, what))
