"""Memory as a band: fits with X GiB spare / at risk / does not fit.

Rule (``memory_band``), with ``limit`` = the GPU's HBM less ``--memory-headroom-gib`` and ``peak`` = the
worst stage's predicted bytes (allocator bytes plus the runtime reserve, sim/memory/stage.py; of the stage's most
loaded data-parallel rank, ``StageMemory.worst_rank_bytes``):

- **does not fit**: ``peak > limit``;
- **at risk**: it fits as predicted, but not if the allocator bytes are ``PEAK_UNDER_PREDICTION`` larger:
  ``peak + PEAK_UNDER_PREDICTION x (peak - reserve) > limit``;
- **fits, X GiB spare**: otherwise, ``X = limit - peak``.

``PEAK_UNDER_PREDICTION`` is how far Megatron-LM's measured peaks exceed echo-tune's predictions on its
functional tests: the 90th percentile of measured / predicted - 1 of ``mem-max-allocated-bytes`` over every
GPT / MoE case that simulates on a GPU count its recipe gives (``python benchmarks/functional_coverage.py``,
docs/memory.md). Nine in ten of those runs peaked within this margin of the prediction; a layout whose
margin to the limit is smaller is one a run can still lose to out-of-memory. The other way,
``PEAK_OVER_PREDICTION`` (``over_limit_risk``): a layout over its limit by less than it may still fit; the
planner shows those "at risk" (plan/safety.py), the search's band keeps "does not fit".
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
# 90th percentile of measured / predicted - 1 of the peak, 268 runs (docs/memory.md, benchmarks/functional_coverage.py)
PEAK_UNDER_PREDICTION = 0.073
BANDS = ("fits", "at risk", "does not fit")
PEAK_OVER_PREDICTION = 0.019
"""How far below its prediction a measured Megatron-LM peak can come: the 5th percentile of measured / predicted - 1
of ``mem-max-allocated-bytes`` is -1.9%, over the 269 GPT / MoE functional-test runs on a recipe's GPU count
(``benchmarks/functional_coverage.py`` at 39a40a3, the same runs as ``PEAK_UNDER_PREDICTION``'s
90th percentile, +7.3%). The model predicts low far more often than high: only 9% of those runs peaked below
their prediction, so the 10th percentile (+0.1%) leaves no margin; one in twenty came in 1.9% or more under it.
A layout over its limit by less than this share of its allocator bytes is one a run can still fit."""


@dataclass(frozen=True, kw_only=True)
class MemoryBand:
    band: str
    """One of ``BANDS``."""
    spare_bytes: int
    """``limit - peak`` (negative: the overshoot)."""
    text: str


def memory_band(*, peak_bytes: int, reserve_bytes: int, limit_bytes: int, stage: int) -> MemoryBand:
    """The band of a layout whose worst stage ``stage`` peaks at ``peak_bytes`` under ``limit_bytes``."""
    spare = limit_bytes - peak_bytes
    margin = PEAK_UNDER_PREDICTION * max(0, peak_bytes - reserve_bytes)
    where = f"peak {peak_bytes / GIB:.1f} GiB on stage {stage} of {limit_bytes / GIB:.1f} GiB"
    if spare < 0:
        return MemoryBand(band="does not fit", spare_bytes=spare,
                          text=f"does not fit: stage {stage} needs {peak_bytes / GIB:.1f} GiB, {-spare / GIB:.1f} "
                               f"GiB over its {limit_bytes / GIB:.1f} GiB limit (HBM less the headroom)")
    if spare < margin:
        return MemoryBand(band="at risk", spare_bytes=spare,
                          text=f"at risk: {where}, {spare / GIB:.1f} GiB spare, less than the "
                               f"{100 * PEAK_UNDER_PREDICTION:.1f}% ({margin / GIB:.1f} GiB) by which nine in ten "
                               f"measured Megatron-LM peaks exceeded their prediction")
    return MemoryBand(band="fits", spare_bytes=spare, text=f"fits, {spare / GIB:.1f} GiB spare: {where}")


def over_beyond_error(peak_bytes: int, limit_bytes: int) -> bool:
    """Whether a predicted peak is over its limit by more than the memory model's over-prediction
    (``PEAK_OVER_PREDICTION`` of the whole peak): it does not fit under any reading of the prediction. The search sets
    such a layout aside untimed (search/space/dominance.py); the planner's "at risk" fallback takes only layouts
    over their limit by less (plan/safety.py ``just_over``)."""
    return peak_bytes - limit_bytes > PEAK_OVER_PREDICTION * peak_bytes


def over_limit_risk(peak_bytes: int, reserve_bytes: int, limit_bytes: int) -> str | None:
    """The "at risk" verdict of a layout predicted over its limit by less than ``PEAK_OVER_PREDICTION`` of its
    allocator bytes (``peak - reserve``); None when it fits as predicted or is further over."""
    over = peak_bytes - limit_bytes
    margin = PEAK_OVER_PREDICTION * max(0, peak_bytes - reserve_bytes)
    if not 0 < over <= margin:
        return None
    return (f"at risk: peak {peak_bytes / GIB:.1f} GiB, {over / GIB:.2f} GiB over its {limit_bytes / GIB:.1f} GiB "
            f"limit (HBM less the headroom); it fits only if the prediction is high, as one in twenty measured "
            f"Megatron-LM peaks were by {100 * PEAK_OVER_PREDICTION:.1f}% ({margin / GIB:.1f} GiB) or more")
