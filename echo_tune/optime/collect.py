"""The distinct op instances the simulator needs for a set of layouts, from their meta traces.

A layout's ops depend on its traced shape only (TP, CP, sequence parallel, micro-batch, precision, EP, ETP),
so each shape is traced once (the tracer caches) and its ops' keys are merged. Collectives are left
out: their times come from the communication model.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.specs.cluster import ClusterSpec
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.specs.model import ModelSpec
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.sim.schedule.passes import trace_pieces


@dataclass(frozen=True, kw_only=True)
class OpInstance:
    """One distinct op to time: its key and what the tracer knows about it."""

    key: str
    name: str
    kind: str
    flops: float
    bytes: float


def distinct_ops(model: ModelSpec, cluster: ClusterSpec, num_gpus: int,
                 layouts: list[ParallelConfig]) -> list[OpInstance]:
    """Every distinct compute op of the layouts' traced pieces, in first-seen order."""
    found: dict[str, OpInstance] = {}
    shapes: set[tuple] = set()
    for parallel in layouts:
        layout = check_compatible(model, cluster, num_gpus, parallel)
        shape = (parallel.tensor_model_parallel_size, parallel.context_parallel_size, layout.sequence_parallel,
                 parallel.micro_batch_size, parallel.precision, parallel.expert_model_parallel_size,
                 parallel.expert_tensor_size)  # EP and ETP: the MoE layer's shapes
        if shape in shapes:
            continue
        shapes.add(shape)
        for trace in trace_pieces(model, parallel, layout).values():
            for op in trace.forward + trace.backward:
                if op.kind != "collective" and op.key not in found:
                    found[op.key] = OpInstance(key=op.key, name=op.name, kind=op.kind, flops=op.flops, bytes=op.bytes)
    return list(found.values())


def space_layouts(path) -> tuple[ModelSpec, ClusterSpec, dict[int, list[ParallelConfig]]]:
    """Model, cluster and the valid layouts (by GPU count) of a search-space file."""
    # lazy: loads optuna (~0.3 s), which importing optime.collect does not
    from echo_tune.search.space.layouts import enumerate_layouts
    # lazy: loads optuna (~0.3 s), which importing optime.collect does not
    from echo_tune.search.space.search_space import load_space

    space = load_space(path)
    by_gpus: dict[int, list[ParallelConfig]] = {}
    for candidate in enumerate_layouts(space):
        by_gpus.setdefault(candidate.num_gpus, []).append(candidate.parallel)
    return space.model, space.cluster, by_gpus
