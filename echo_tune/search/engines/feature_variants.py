"""The default search's second level: the recipe features (search/space/features.py) of the best layouts' structures.

A space with the recipe features is 10-100x larger than its structures and batch settings alone (Qwen3-30B-A3B /
16 H100 with FP8: 24,120 layouts without them, 208,556 with them), too many to list before a search. So the default
search (auto.py) runs in two levels:

1. **lead features** - the space with every feature narrowed to its lead value (``LEAD``: what NVIDIA's recipes
   run where it applies: the EP overlap, the flex dispatcher with DeepEP, per-tensor current-scaling FP8; for
   selective recompute the set of the most modules, lightest on memory), searched structure first as before
   (``core_space``);
2. **feature toggles** - the dispatcher's kernels and the FP8 recipe (``SWEEP_FIELDS``) swept for the best layouts
   of the best structures, every combination of the features' listed values for the best layout of fewer of them
   (``variants``), each checked by Megatron's rules and simulated; then the best structures' batch settings again
   with their features (``with_features``), as the batch settings that suit one set of features can differ from
   those of another. Which layouts, in which order: feature_level.py.
"""

from __future__ import annotations

import dataclasses
import itertools

from echo_tune.search.space.features import FEATURE_FIELDS
from echo_tune.search.space.fields import FIELD_ORDER, MODULE_SET_FIELDS, module_choice
from echo_tune.search.space.layouts import CHECK_AFTER, Candidate, RejectedLayout, _candidate, _check, options
from echo_tune.search.space.search_space import SearchSpace
from echo_tune.search.space.layouts import draw

LEAD = {"moe_token_dispatcher_type": ("flex", "alltoall", "allgather"),
        "moe_flex_dispatcher_backend": ("deepep", "hybridep"),
        "overlap_moe_expert_parallel_comm": (True, False), "delay_wgrad_compute": (True, False),
        "moe_shared_expert_overlap": (True, False), "overlap_param_gather_with_optimizer_step": (True, False),
        "fp8_recipe": ("tensorwise", "delayed", "mxfp8", "blockwise"),
        "cuda_graph_impl": ("none",), "moe_permute_fusion": (True, False), "moe_router_fusion": (True, False),
        "cross_entropy_loss_fusion": (True, False)}
"""Per feature, its values in order of preference for the first level (the first one listed in the space wins)."""


def lead_value(field_name: str, values: tuple):
    if field_name == "recompute_modules":  # the most modules: selective recompute at its lightest on memory, so a
        # structure that fits only with it ranks by it (DeepSeek-V3's recipe structure peaked 73.5 GiB, at risk, with
        # Megatron's default core_attn, and fits with mla_up_proj + mlp)
        return max(values, key=lambda v: len(v.split()) if v else 0)
    for v in LEAD.get(field_name, ()):
        if v in values:
            return v
    return values[0]


def has_features(space: SearchSpace) -> bool:
    return any(len(space.choices[f]) > 1 for f in FEATURE_FIELDS)


def core_space(space: SearchSpace) -> SearchSpace:
    """The space with every recipe feature narrowed to its lead value (the space itself when none is searched)."""
    if not has_features(space):
        return space
    choices = dict(space.choices)
    for f in FEATURE_FIELDS:
        if len(choices[f]) > 1:
            choices[f] = (lead_value(f, choices[f]),)
    return dataclasses.replace(space, choices=choices)


SWEEP_FIELDS = ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "fp8_recipe")
"""Features swept first over more structures (``SWEEP_SHARE`` x the top): the dispatcher's kernels change a step
most (Qwen3-30B-A3B / 16 H100, FP8, TP1 EP16 mbs1: 16.0 s with DeepEP, 8.0 s with HybridEP across its two nodes),
so a structure whose lead dispatcher is its worst one ranked 10th and missed the exhaustive optimum by 12%."""
SWEEP_SHARE = 4
SWEEP_PER = 3
"""The sweep takes the best SWEEP_SHARE x FEATURE_TOP structures, up to SWEEP_PER layouts of each (in the default
space of Qwen3-30B-A3B / 16 H100 the optimum's structure ranked 20th of 191 on its lead features)."""


def variants(space: SearchSpace, base: Candidate, fields: tuple = FEATURE_FIELDS) -> list[Candidate]:
    """Every valid layout of ``space`` that has ``base``'s settings but ``fields`` (recipe features; ``base``
    among them)."""
    config = base._config
    out: list[Candidate] = []

    def walk(index: int, chosen: dict) -> None:
        if index == len(FIELD_ORDER):
            try:
                out.append(_candidate(space, chosen))
            except RejectedLayout:
                pass
            return
        f = FIELD_ORDER[index]
        values = options(space, f, chosen)
        if f not in fields:
            mine = module_choice(config[f]) if f in MODULE_SET_FIELDS else config[f]
            values = (mine,) if mine in values else values[:1]
        for v in values:
            nxt = {**chosen, f: v}
            if f in CHECK_AFTER:
                try:
                    _check(space, nxt)
                except RejectedLayout:
                    continue
            walk(index + 1, nxt)
    walk(0, {})
    return out


def with_features(space: SearchSpace, members: list[Candidate], best: Candidate) -> list[Candidate]:
    """``members`` (layouts of one structure, lead features) with ``best``'s recipe features where valid."""
    feats = {f: best._config[f] for f in FEATURE_FIELDS}
    out = []
    for m in members:
        config = {**m._config, **feats}
        try:
            out.append(_draw_config(space, config))
        except RejectedLayout:
            continue
    return out


def _draw_config(space: SearchSpace, config: dict) -> Candidate:

    def choose(name, values):
        v = module_choice(config[name]) if name in MODULE_SET_FIELDS else config[name]
        return v if v in values else values[0]
    return draw(space, choose)


_COARSE = ("num_gpus", "tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
           "virtual_pipeline_model_parallel_size")


def find(candidates: list[Candidate], keys: list[tuple]) -> dict[tuple, Candidate]:
    """The candidates whose ``key`` is among ``keys`` (a key built only for those that share a key's GPU count, TP,
    PP, micro-batch and interleaving: every candidate's key cost 0.8 s of a 6,558-layout search)."""
    wanted = set(keys)
    coarse = {tuple(dict(k).get(f) for f in _COARSE) for k in wanted}
    out = {}
    for c in candidates:
        p = c.parallel
        if (c.num_gpus, p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.micro_batch_size,
                p.virtual_pipeline_model_parallel_size) in coarse:
            key = c.key
            if key in wanted:
                out[key] = c
    return out


def _best_per_structure(candidates: list[Candidate], scores: dict, top: int, structure,
                        per: int = 1) -> list[Candidate]:
    """The fastest fitting layouts (by ``scores``) of each of the ``top`` best structures among ``candidates``: up to
    ``per`` of each, of different recompute granularity (the lead features can favour another one than the rest
    do: on Qwen3-30B-A3B / 16 H100 FP8 TP1 EP16, full recompute at mbs 4 and 2, 15.4 s and 16.0 s, beat mbs 1
    without recompute on DeepEP, which with HybridEP and the EP overlap runs in 8.0 s; without recompute the EP
    overlap applies, with full recompute it does not)."""
    fitting = sorted(((s, k) for k, s in scores.items() if s is not None), key=lambda p: p[0])
    by_key = find(candidates, [k for _, k in fitting[:max(top * per * 50, 200)]])
    picked, kinds = [], {}
    for _, k in fitting:
        c = by_key.get(k)
        if c is None:
            continue
        s = structure(c)
        kind = c.parallel.recompute_granularity
        if s not in kinds and len(kinds) >= top:
            continue
        taken = kinds.setdefault(s, set())
        if kind not in taken and len(taken) < per:
            taken.add(kind)
            picked.append(c)
    return picked


def feature_round(space: SearchSpace, core_valid: list[Candidate], scores: dict, top: int, cap: int,
                  structure, known: list[Candidate] = (), fields: tuple = FEATURE_FIELDS,
                  per: int = 1) -> list[Candidate]:
    """Layouts for the second level: the ``fields`` variants of the best layout of each of the best ``top``
    structures (by the stored ``scores``; layouts looked up in ``core_valid`` and ``known``), at most ``cap`` not
    yet simulated."""
    picked = _best_per_structure(list(core_valid) + list(known), scores, top, structure, per)
    todo: list[Candidate] = []
    keys = set(scores)
    for c in picked:
        for v in variants(space, c, fields):
            if v.key not in keys:
                keys.add(v.key)
                todo.append(v)
    return list(itertools.islice(todo, cap))
