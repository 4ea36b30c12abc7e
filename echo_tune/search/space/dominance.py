"""Layouts that can only be slower than another layout of the space: not simulated, stored as such.

Two rules, stated and checked against exhaustive runs (tests/search/test_dominance.py; docs/search.md):

**Recompute only adds work.** Activation recompute (``--recompute-granularity selective|full`` with any
method and layer count) replays part of each forward before its backward and changes nothing else the step
is made of: the same GEMMs, collectives, pipeline schedule, DP and optimizer work, plus the replayed
forward. Every pass is as long or longer (the replayed regions are costed on their own and added to the
backward) and the pipeline is a max-plus system, monotone in its tasks' durations; FSDP's exposed gathers
shrink by at most what the backward grows; the DP tail (exposed time plus the interference it adds) ends
no sooner when a bucket is ready later or the compute ends later, while ``compute_slowdown - 1 < 1 /
comm_slowdown`` (every shipped profile), as a bucket is slowed only while the compute runs (
``sim/dp._slowed_end``: a review found that slowing the whole of a bucket that started before the compute
end broke this; it then simulated 335,016 layout pairs of four models - host-bound profiles, CUDA graphs,
FP8, FSDP, the EP overlap, every recompute method and module - and found no recompute variant faster; the
smallest difference 0, where the recompute is empty). So
when the same layout *without* recompute fits in memory, each of its recompute variants is at least as slow:
it is stored as a dominated trial (``PRUNED``, user attribute ``dominated_by``, infeasible for a sampler
reusing the study, ``feasible`` False in trials.csv) and not simulated. Recompute exists to fit memory;
where memory is not the problem it only costs time.

It holds for objectives that follow the step time at a fixed GPU count (step time, cost per step, GPU
count); a space that minimises peak memory simulates every layout (recompute is what lowers it), and so does
a search whose profile breaks the DP tail's condition above (a calibrated ``compute_slowdown`` near 2).
The plan's and search's near-tie check simulates the recompute variants of the layouts near the best, which
it needs (``variants_near_best``).
Checked against exhaustive runs of the six benchmark spaces of docs/search.md: no recompute variant of a
fitting layout is faster than it (on Qwen3-30B-A3B / 256 H100, 24,392 of 43,194 layouts skipped).

**Recompute cannot fit what the rest already overflows.** Recompute changes only a stage's activations (and
CUDA graphs' and FSDP's buffers, which follow them): its weights, gradient buffer, optimizer states,
workspaces, runtime reserve and data-parallel spread (``StageMemory.floor_bytes``) are the same with or
without it. So when the layout without recompute is over the GPU's memory by that floor alone on some stage,
no recompute variant of it fits: stored as dominated (``dominated_by`` ``memory_floor>capacity``) and not
simulated. FSDP layouts are left out (their working buffers are computed apart), and so is a space that
minimises peak memory (every layout's memory is what it searches). Checked on the six benchmark spaces:
19,110 pairs of a recompute variant and its layout without it (every over-floor group, a sample of the
others) had equal floors on every stage, and no variant of an over-floor layout fit.

**Over memory beyond the band: not timed.** A layout's memory does not depend on how long its passes take
(``sim/memory/step_memory.py``; fine-grained activation offloading, which drains activations while a forward
runs, is the exception and is always simulated whole). So its memory is computed first, and a layout whose
predicted peak is over the limit (HBM less the headroom) by more than the memory model's over-prediction
(``memory_band.PEAK_OVER_PREDICTION``, 1.9% of the peak: the 5th percentile of measured / predicted - 1 over 269
Megatron-LM runs) is stored with its memory (user attribute ``memory``: peak, limit, overshoot, floor) and
``dominated_by`` ``peak>capacity``, without its step being simulated. Nothing the search reports reads the step
time of such a layout: the best, near-ties and the explanation read fitting layouts, the closest miss reads the
overshoot, and the fallback "at risk" layout (``plan/planner.just_over``) is one over its limit by at most that
same margin, which is still simulated whole. In an exhaustive run of the Qwen3-235B-A22B recipe space on 256 H100
this skips the timing of 58% of the layouts. A layout the timing would have rejected for a rule found only there
(a pipeline too irregular to extrapolate) is then stored over memory instead of rejected: infeasible either way.
Not in a space that minimises peak memory (every layout is simulated there).

Dominance is decided inside a batch, on the layouts simulated just before: ``ordered_groups`` keeps each
layout's recompute variants together, its no-recompute variant first, and batches are cut between groups.
"""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Iterable, Iterator

from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.search.space.layouts import Candidate, RejectedLayout, config_key, draw
from echo_tune.search.engines.objective import evaluate, evaluate_memory, memory_record
from echo_tune.sim.memory.memory_band import over_beyond_error
from echo_tune.search.space.search_space import SearchSpace, space_profile
from echo_tune.sim.schedule.memo import profile_for_cluster

RECOMPUTE_FIELDS = ("recompute_granularity", "recompute_method", "recompute_num_layers")
MONOTONE_OBJECTIVES = ("step_time", "cost", "num_gpus")
DOMINATED_BY_RECOMPUTE = "recompute_granularity=none"
"""``dominated_by`` of a recompute variant: the same layout without recompute fits, and is at least as fast."""
DOMINATED_BY_MEMORY = "memory_floor>capacity"
"""``dominated_by`` of a recompute variant that cannot fit: the same layout without recompute already holds more
than the GPU's memory on a stage in what recompute does not change (``StageMemory.floor_bytes``)."""

OVER_MEMORY = "peak>capacity"
"""``dominated_by`` of a layout over memory by more than the memory model's over-prediction: its memory is stored
(user attribute ``memory``), its step not simulated."""


def applies(space: SearchSpace, profile=None) -> bool:
    """Whether a dominated layout may go unsimulated: no objective is peak memory, and the profile's slowdowns
    keep the DP tail monotone (``compute_slowdown - 1 < 1 / comm_slowdown``; ``profile`` None: the cluster's)."""
    if not all(o in MONOTONE_OBJECTIVES for o in space.objectives):
        return False
    if profile is None:  # the cluster's own, as the simulator takes it (cached per cluster object)

        profile = profile_for_cluster(space.cluster)
    return profile.compute_slowdown - 1.0 < 1.0 / profile.comm_slowdown


_OTHER_SETTINGS = operator.attrgetter(*(f.name for f in dataclasses.fields(ParallelConfig)
                                        if f.name not in RECOMPUTE_FIELDS))


def group_key(candidate: Candidate) -> tuple:
    """The layout's settings but recompute: the same key for a layout and its recompute variants."""
    return candidate.num_gpus, _OTHER_SETTINGS(candidate.parallel)


def config_group_key(config: dict) -> tuple:
    """``group_key`` from a layout's settings by name (a stored trial's ``config``): its settings but recompute."""
    return config_key({k: v for k, v in config.items() if k not in RECOMPUTE_FIELDS})


def stored_fits(records) -> frozenset:
    """The ``config_group_key`` of every stored record without recompute that fits: a search that simulates a
    structure over several rounds (auto.py) skips the recompute variants of a layout a round before found fitting."""
    return frozenset(config_group_key(r["config"]) for r in records
                     if r.get("fits_memory") and r["config"].get("recompute_granularity") is None)


def ordered_groups(candidates: Iterable[Candidate]) -> list[list[Candidate]]:
    """``candidates`` as groups of recompute variants, in the order of each group's first member, the member
    without recompute first (the order is otherwise kept)."""
    groups: dict[tuple, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(group_key(c), []).append(c)
    out = []
    for members in groups.values():
        if len(members) > 1:
            members.sort(key=lambda c: c.parallel.recompute_granularity is not None)
        out.append(members)
    return out


class Dominance:
    """Which layouts of a batch need no simulation, given the results of those before them."""

    def __init__(self, space: SearchSpace, profile=None, stored_fits: frozenset = frozenset()):
        self.active = applies(space, profile)
        # peak memory as an objective: every layout simulated (its memory is what is searched)
        self.memory_rule = "peak_memory" not in space.objectives
        self._fits: set[tuple] = set()  # group keys whose layout without recompute fits
        self._over: set[tuple] = set()  # group keys whose layout without recompute is over memory at its floor
        self._stored_fits = stored_fits  # config_group_keys of stored layouts without recompute that fit

    def dominated_by(self, candidate: Candidate) -> str | None:
        """The rule that makes ``candidate`` unneeded, or None (simulate it)."""
        if candidate.parallel.recompute_granularity is None:
            return None
        key = group_key(candidate)
        if key in self._over:
            return DOMINATED_BY_MEMORY
        if not self.active:
            return None
        if key in self._fits or (self._stored_fits and config_group_key(candidate._config) in self._stored_fits):
            return DOMINATED_BY_RECOMPUTE
        return None

    def over_memory(self, space: SearchSpace, candidate: Candidate, profile=None) -> tuple[dict | None, object]:
        """(the memory record (``objective.memory_record``) of a layout over memory beyond the band, whose step need
        not be simulated, else None; the ``StepMemory`` computed, None if none was). Raises RejectedLayout for a
        layout that breaks a rule."""
        if not self.memory_rule:
            return None, None
        memory = evaluate_memory(space, candidate, profile=profile)
        if memory is None or not over_beyond_error(memory.peak_memory_bytes, memory.memory_capacity_bytes):
            return None, memory
        return memory_record(space, candidate, memory), memory

    def simulated(self, candidate: Candidate, record: dict | None) -> None:
        """Note a simulated layout (``record`` None: rejected by a rule)."""
        if record is None or candidate.parallel.recompute_granularity is not None:
            return
        if record["fits_memory"]:
            if self.active:
                self._fits.add(group_key(candidate))
        elif self.memory_rule and over_floor(record) and not candidate.parallel.use_megatron_fsdp:
            self._over.add(group_key(candidate))


def over_floor(record: dict) -> bool:
    """Whether a simulated layout is over memory by what no recompute setting changes (its stages'
    ``StageMemory.floor_bytes``; records of studies stored before the rule have no floor: False)."""
    return record.get("memory_floor_bytes", 0) > record["memory_capacity_bytes"]


def closest_misses(space: SearchSpace, records: list[dict]) -> list[dict]:
    """Where no simulated layout fits: records of the recompute variants the memory rule skipped that could
    overflow memory less than every simulated layout, simulated now (a variant overflows by at least its
    layout's floor, so layouts are taken by floor and stop where the floor passes the least overflow found).
    What the closest miss and its fit hint need (``search``, ``plan``)."""
    if not records or any(r["fits_memory"] for r in records):
        return []
    least = min(r["memory_overshoot_bytes"] for r in records)
    profile = space_profile(space)
    heads = sorted((r for r in records if r["config"].get("recompute_granularity") is None and over_floor(r)
                    and r["memory_floor_bytes"] - r["memory_capacity_bytes"] < least),
                   key=lambda r: r["memory_floor_bytes"] - r["memory_capacity_bytes"])
    known = _known_variants(records, heads)
    out = []
    for record in heads:
        if record["memory_floor_bytes"] - record["memory_capacity_bytes"] >= least:
            break
        for variant in _unseen_variants(space, record, known, profile):
            out.append(variant)
            least = min(least, variant["memory_overshoot_bytes"])
    return out


def closest_miss(space: SearchSpace, over: list[dict]) -> dict | None:
    """Where no layout fits: of the records over memory (simulated or untimed) and the recompute variants the memory
    rule did not simulate (``closest_misses``, simulated now), the one that overflows the least; None without any.
    The one rule of ``search``'s and ``plan``'s closest miss."""
    if not over:
        return None
    return min([*over, *closest_misses(space, over)], key=lambda r: r["memory_overshoot_bytes"])


def _unseen_variants(space: SearchSpace, record: dict, known: set[tuple], profile) -> Iterator[dict]:
    """The records of ``record``'s layout's recompute variants not in ``known`` (``config_key``s; each is added),
    simulated now; a variant a rule rejects is left out."""
    for values in itertools.product(*(space.choices[f] for f in RECOMPUTE_FIELDS)):
        config = {**record["config"], **dict(zip(RECOMPUTE_FIELDS, values))}
        try:
            candidate = draw(space, lambda name, _values: config[name])
            if candidate.key in known:
                continue
            known.add(candidate.key)
            yield evaluate(space, candidate, profile=profile)[0]
        except RejectedLayout:
            continue


_COARSE = ("num_gpus", "tensor_model_parallel_size", "pipeline_model_parallel_size", "micro_batch_size",
           "virtual_pipeline_model_parallel_size")


def _known_variants(records: list[dict], heads: list[dict]) -> set[tuple]:
    """The identities (``config_key``) of the records that may be recompute variants of ``heads``: those with a
    head's GPU count, TP, PP, micro-batch and interleaving (``config_key`` of every record took 0.4 s of a
    search's near-tie check over 17,582 records)."""
    coarse = {tuple(h["config"].get(k) for k in _COARSE) for h in heads}
    return {config_key(r["config"]) for r in records if tuple(r["config"].get(k) for k in _COARSE) in coarse}


def variants_near_best(space: SearchSpace, records: list[dict], pct: float) -> list[dict]:
    """Records of the recompute variants not simulated of the fitting layouts within ``pct`` percent of the
    fastest (simulated now, a handful): what a near-tie check needs, since a layout that fits without
    recompute is dominated in step time but its recompute variants leave more memory free."""
    profile = space_profile(space)
    fitting = [r for r in records if r["fits_memory"]]
    if not fitting or not applies(space, profile) or not pct >= 0:
        return []
    limit = min(r["step_time_s"] for r in fitting) * (1 + pct / 100)
    heads = [r for r in fitting if r["step_time_s"] <= limit and r["config"].get("recompute_granularity") is None]
    known = _known_variants(records, heads)
    out = []
    for record in heads:
        out += _unseen_variants(space, record, known, profile)
    return out
