"""How much of a predicted step the fitted host time per kernel carries, and what the bands make of it.

The host time per kernel is fitted on the rows of x86 hosts, H100 and B200 (``cost/host/host_time.py``). The
validated fine-grained runs of the 2025-26 Megatron-Bridge tables (Qwen3-30B-A3B on H100 and B200) are host-bound in
the model (40-60% of their step) and, with the host time at 0, predicted 57-65% too fast (docs/moe.md): either the
host is what slows them, or the fitted host time stands in for GPU work the model lacks. A layout that issues fewer
kernels (HybridEP with eight local experts, a larger micro-batch, CUDA graphs) is predicted mostly by its GPU side, so
it does not inherit those runs' agreement.

``host_share`` re-simulates a layout with the host time at 0: (step - step without host) / step. The band of a
prediction (``plan/bands.py band_for``) then covers the error runs had on their GPU side alone, scaled to the share
the host carries in this prediction: with the worst such error g (a fraction, negative = too fast) and this layout's
share s, the low end is at most (1 + g) / (1 - s) - 1. At s = 0 that is g (the GPU side is all there is); at the
share the host-bound runs had it is their own error, inside the band. Which runs' g (``gpu_side_floor``): those as
GPU-bound as the prediction where the band has enough of them (their GPU side measured in its regime: Qwen3-30B-A3B's
BF16 layouts on 16 H100, host share 0, err -5..-18%), else every run's.
"""

from __future__ import annotations

from functools import cache
from typing import Callable

from echo_tune.cost.host.host_time import without_host
from echo_tune.search.outputs.results import candidate_of
from echo_tune.search.space.search_space import space_profile
from echo_tune.sim.schedule.memo import profile_for_cluster
from echo_tune.sim.simulate import simulate

SAME_REGIME_SHARE = 0.10
"""Runs whose host share is at most a prediction's plus this much are in its regime (``gpu_side_floor``)."""
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
    return share_of(step, gpu_side)


def share_of(step_s: float, gpu_side_s: float) -> float:
    """The share of a step the host carries: (step - its GPU side alone) / step, 0 where the host adds nothing."""
    return max(0.0, (step_s - gpu_side_s) / step_s) if step_s > 0 else 0.0


def host_share_once(model, cluster, num_gpus: int, parallel, **kwargs) -> Callable[[], float]:
    """``host_share`` as a callable that simulates at most once (a report's band and its host-bound note both ask;
    ``cache_info().currsize`` says whether it has)."""
    return cache(lambda: host_share(model, cluster, num_gpus, parallel, **kwargs))


def record_host_share(space, record: dict) -> float:
    """``host_share`` of a search record's layout, simulated as the search did (its space's profile and headroom)."""
    candidate = candidate_of(space, record)
    return host_share(candidate.model, space.cluster, candidate.num_gpus, candidate.parallel,
                      profile=space_profile(space), memory_headroom_bytes=int(space.memory_headroom_gib * 2**30))


def gpu_side_low_pct(gpu_side_error_pct: float, share: float) -> float:
    """The band's low end the family's worst GPU-side error allows at this host share (module docstring), in %."""
    share = min(max(share, 0.0), MAX_SHARE)
    return 100.0 * ((1.0 + gpu_side_error_pct / 100.0) / (1.0 - share) - 1.0)


def gpu_side_floor(runs: dict, host_share: float, min_runs: int, key: str,
                   wider: dict | None = None, wider_key: str = "") -> tuple[float, str]:
    """The worst GPU-side error (%) the low end of a prediction at ``host_share`` answers to, and which runs gave it.

    Where at least ``min_runs`` of the band's runs (``runs``, named ``key``) lean on the fitted host time no more than
    the prediction does (host share at most ``host_share + SAME_REGIME_SHARE``), their GPU side was measured in the
    prediction's own regime: theirs is the floor; else, where ``wider`` (the runs of the same GPU and kind, every
    precision and scale) has that many, theirs. A run the host carries more of says, with the host time at 0, how
    much the host carries in it as much as how wrong the GPU side is, so only where neither has enough runs like the
    prediction does the floor fall back to every run's of the band (the conservative reading: the fitted host time
    stands for GPU work the model lacks; plan/bands.py band_for). Runs measured at 0% host share of the same GPU and
    kind are what showed the difference: Qwen3-30B-A3B's BF16 layouts on 16 H100 (calibration/collected-runs/) err
    -5..-18% where its host-bound FP8 rows' GPU side alone erred -60..-65%."""
    limit = host_share + SAME_REGIME_SHARE
    for table, name in ((runs, key), (wider, wider_key)):
        alike = [g for h, g in (table or {}).get("gpu_side_by_host_share") or [] if h <= limit]
        if len(alike) >= min_runs:
            return min(alike), f"its {len(alike)} runs at most as host-bound (host share <= {limit:.0%}) of {name}"
    return runs["gpu_side_min_signed_error_pct"], f"the runs of {key}"


HOST_BOUND_SHARE = 0.20
"""A step the host carries at least this share of is called host-bound in reports (``host_bound_note``)."""


def host_bound_note(share: float, model, parallel, host_time_per_kernel_s: float) -> str | None:
    """What a report says of a host-bound step (``share`` >= ``HOST_BOUND_SHARE``): how much of it is the GPU
    waiting on the host, and the settings that issue fewer kernels per token in this model (cost/host/host_bound.py:
    each kernel issued from Python costs the host its time whatever its size, a quantisation TE's C++ launches only
    the launch; sim/schedule/costing.py counts them). None below it."""
    if share < HOST_BOUND_SHARE:
        return None
    levers = [f"a larger --micro-batch-size (now {parallel.micro_batch_size}: more work per kernel)"]
    if parallel.cuda_graph_impl == "none":
        levers.append("CUDA graphs (--cuda-graph-impl: a captured layer costs the host one launch)")
    if model.is_moe:
        local = model.num_experts // parallel.expert_model_parallel_size
        levers.append(f"fewer local experts per GPU (a larger --expert-model-parallel-size; now {local}, each a GEMM "
                      f"issued from Python per grouped GEMM)")
        if not model.moe_pad_expert_input_to_capacity and parallel.expert_model_parallel_size > 1:
            levers.append("drop-and-pad routing (--moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity: "
                          "no host synchronisation per layer, but tokens over capacity are dropped)")
    return (f"host-bound: the GPU waits on the host for {share:.0%} of this step (host time per kernel issued from "
            f"Python {host_time_per_kernel_s * 1e6:.0f} us, fitted on published runs; cost/host/host_bound.py). Fewer kernels "
            f"per token shorten it in this model: " + "; ".join(levers) + ". `echo-tune search` weighs them against memory")


def host_bound_line(share: float | None) -> str | None:
    """The one-line form of ``host_bound_note`` for a table of layouts (``rank``, ``plan``); None below the share."""
    if share is None or share < HOST_BOUND_SHARE:
        return None
    return (f"host-bound: the GPU waits on the host for {share:.0%} of its step; `echo-tune simulate` of the layout names "
            f"the settings that issue fewer kernels per token")
