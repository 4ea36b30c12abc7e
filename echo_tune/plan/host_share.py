"""How much of a predicted step the fitted host time per kernel carries, and what the bands make of it.

The host time per kernel is fitted on the H100 rows (``cost/host/host_time.py``) and, on fine-grained MoE, stands
in for GPU work the model lacks: the validated Qwen3-30B-A3B runs on H100 and B200 are host-bound in the model
(55-65% of their step) and, with the host time at 0, predicted 57-65% too fast (docs/moe.md). A layout of the same
family that issues fewer kernels (an FP8 recipe of one quantisation kernel instead of three, a larger micro-batch)
is predicted mostly by its GPU side and does not inherit those runs' agreement.

``host_share`` re-simulates a layout with the host time at 0: (step - step without host) / step. The band of a
prediction (``plan/bands.py band_for``) then covers the error its family's runs had on their GPU side alone, scaled
to the share the host carries in this prediction: with the worst such error g of its own family's runs (a fraction,
negative = too fast) and this layout's share s, the low end is at most (1 + g) / (1 - s) - 1. At s = 0 that is g
(the GPU side is all there is); at the share the host-bound runs had it is their own error, inside the band.
"""

from __future__ import annotations

from echo_tune.cost.host.host_time import without_host
from echo_tune.search.outputs.results import candidate_of
from echo_tune.search.space.search_space import space_profile
from echo_tune.sim.schedule.memo import profile_for_cluster
from echo_tune.sim.simulate import simulate

MAX_SHARE = 0.95
"""A share above this is taken as this (the bound 1 / (1 - s) grows without limit as s nears 1)."""


def host_share(model, cluster, num_gpus: int, parallel, *, profile=None, step_time_s: float | None = None,
               **simulate_kwargs) -> float:
    """Share of the predicted step the host time per kernel carries (0 where the profile's host time is 0)."""
    base = profile or profile_for_cluster(cluster)
    if not base.host_time_per_kernel_s:
        return 0.0
    step = step_time_s if step_time_s is not None else simulate(model, cluster, num_gpus, parallel, profile=profile,
                                                                **simulate_kwargs).step_time_s
    gpu_side = simulate(model, cluster, num_gpus, parallel, profile=without_host(base), **simulate_kwargs).step_time_s
    return max(0.0, (step - gpu_side) / step) if step > 0 else 0.0


def record_host_share(space, record: dict) -> float:
    """``host_share`` of a search record's layout, simulated as the search did (its space's profile and headroom)."""
    candidate = candidate_of(space, record)
    return host_share(candidate.model, space.cluster, candidate.num_gpus, candidate.parallel,
                      profile=space_profile(space), memory_headroom_bytes=int(space.memory_headroom_gib * 2**30))


def gpu_side_low_pct(gpu_side_error_pct: float, share: float) -> float:
    """The band's low end the family's worst GPU-side error allows at this host share (module docstring), in %."""
    share = min(max(share, 0.0), MAX_SHARE)
    return 100.0 * ((1.0 + gpu_side_error_pct / 100.0) / (1.0 - share) - 1.0)
