"""What a parsed nccl-tests log holds: its ranks, its result rows with units, and the group they ran on
(parsed by ``nccl_tests.py``, which these names are also imported from)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from echo_tune.config.rules.compatibility import GroupPlacement


@dataclass(frozen=True, kw_only=True)
class RankInfo:
    """One ``# Rank`` header line."""

    rank: int
    pid: int
    host: str
    device: int
    gpu_name: str


@dataclass(frozen=True, kw_only=True)
class NcclTestsRow:
    """One result row; times in microseconds, bandwidths in GB/s (1e9 bytes)."""

    line: int
    size_bytes: int
    count: int
    dtype: str
    redop: str | None
    root: int | None
    time_us: float
    algbw_gbyte_s: float
    busbw_gbyte_s: float
    in_place_time_us: float | None
    in_place_algbw_gbyte_s: float | None
    in_place_busbw_gbyte_s: float | None


@dataclass(frozen=True, kw_only=True)
class NcclTestsLog:
    """A parsed nccl-tests log."""

    path: str
    collective: str
    ranks: tuple[RankInfo, ...]
    rows: tuple[NcclTestsRow, ...]
    header: dict = field(default_factory=dict)
    avg_busbw_gbyte_s: float | None = None
    ignored_lines: tuple[tuple[int, str], ...] = ()
    """(line number, reason) of the stderr and NCCL debug lines that hold no result."""
    refused_rows: tuple[tuple[int, str], ...] = ()
    """(line number, reason) of result rows refused because nccl-tests counted wrong results."""
    warnings: tuple[str, ...] = ()

    @property
    def num_gpus(self) -> int:
        return len(self.ranks)

    @property
    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.ranks})

    @property
    def num_nodes(self) -> int:
        return len(self.hosts)

    @property
    def ranks_per_node(self) -> int:
        return max(Counter(r.host for r in self.ranks).values())

    @property
    def gpu_name(self) -> str:
        return ", ".join(sorted({r.gpu_name for r in self.ranks if r.gpu_name})) or "unknown"

    def placement(self) -> GroupPlacement:
        return GroupPlacement(size=self.num_gpus, ranks_per_node=self.ranks_per_node, num_nodes=self.num_nodes)
