"""The flex dispatcher's NVLink-side bandwidth per GPU generation, from its published measurements.

``data/flex-dispatch-nvlink.yaml`` holds DeepEP's and HybridEP's own measured dispatch / combine bandwidths inside
one NVLink domain by platform (Hopper, B200, GB200 NVL72), EP ranks and SMs (sources in its header). A lookup
interpolates linearly between measured rank counts and between measured SM counts; past the largest measured rank
count it keeps the largest one's row (EP 64 inside a 72-GPU rack: the 36-rank row), past the largest SM count it
stays flat (the link is the bound there: the B200 DeepEP rows flatten from 36 SMs), and below the smallest SM count
it falls in proportion (each SM copies its share of the tokens). The result never exceeds the cluster's NVLink
bandwidth per GPU. A GPU the file does not list takes the Hopper row, capped by its NVLink.
"""

from __future__ import annotations

import bisect
from functools import lru_cache
from importlib import resources
from pathlib import Path
from echo_tune.config.load.loading import read_yaml

DIRECTIONS = ("dispatch", "combine")
FALLBACK_PLATFORM = "h800"


@lru_cache(maxsize=1)
def _table() -> dict:
    return read_yaml(Path(str(resources.files("echo_tune.cost").joinpath("data", "flex-dispatch-nvlink.yaml"))),
                     "flex dispatcher NVLink bandwidths")


def platform_for(gpu_name: str) -> str:
    """The measured platform whose rows a GPU uses (the Hopper row for a GPU the file does not list)."""
    return (_table().get("platform_of") or {}).get(gpu_name, FALLBACK_PLATFORM)


def _interpolate(points: list[tuple[int, float]], x: float, *, below: str) -> float:
    """Piecewise-linear over sorted (x, y); flat past the last point; below the first: flat, or ``proportional``."""
    xs = [p for p, _ in points]
    if x <= xs[0]:
        return points[0][1] * (x / xs[0] if below == "proportional" else 1.0)
    if x >= xs[-1]:
        return points[-1][1]
    i = bisect.bisect_right(xs, x)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def nvlink_gbyte_s(gpu_name: str, kernel: str, direction: str, ranks: int, num_sms: int) -> float:
    """Measured (interpolated) bandwidth of ``kernel``'s ``direction`` among ``ranks`` GPUs of one NVLink domain
    at ``num_sms`` SMs, in GB/s (not yet capped by the cluster's link: ``flex_dispatch_time_s`` does that)."""
    rows = _table()["rows"][platform_for(gpu_name)]
    by_ranks = rows.get(kernel) or rows["deepep"]
    per_rank_count = []
    for count in sorted(by_ranks):
        by_sms = sorted(by_ranks[count].items())
        per_rank_count.append((count, _interpolate([(s, r[direction]) for s, r in by_sms], num_sms,
                                                   below="proportional")))
    return _interpolate(per_rank_count, ranks, below="flat")


def label(gpu_name: str) -> str:
    """What a report says of the bandwidths a GPU's flex dispatcher runs at."""
    platform = platform_for(gpu_name)
    carried = "" if platform == gpu_name.split("-")[0] else f" measured on {platform}, applied to {gpu_name}"
    return f"NVLink-side bandwidth from DeepEP / HybridEP's published rows{carried} (cost/data/flex-dispatch-nvlink.yaml)"
