"""What a fit returns: per-point residuals and per-quantity summaries, shared by every fitter."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# A fit is flagged as poor past these relative errors (root mean square / worst point).
POOR_FIT_RMS = 0.15
POOR_FIT_MAX = 0.40


@dataclass(frozen=True, kw_only=True)
class PointResidual:
    """One measured point against the fitted model's prediction of it."""

    quantity: str
    """What was fitted, e.g. "all_reduce intra_node" or "gemm bf16"."""
    source: str
    """Where the point came from: "file line N" or "file row N"."""
    label: str
    """The point's coordinates, e.g. "n=8 size=1048576"."""
    measured: float
    predicted: float
    unit: str

    @property
    def relative_error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured if self.measured else math.inf


@dataclass(kw_only=True)
class FitResult:
    """The fit of one quantity: its coefficients, how they were obtained, and every point's residual."""

    quantity: str
    method: str
    """"least squares", "derived" (from datasheets and other fits, not measured) or "datasheet"."""
    params: dict
    points: list[PointResidual] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def rms_relative_error(self) -> float | None:
        if not self.points:
            return None
        return math.sqrt(sum(p.relative_error ** 2 for p in self.points) / len(self.points))

    @property
    def max_relative_error(self) -> float | None:
        return max((abs(p.relative_error) for p in self.points), default=None)

    def flag_poor_fit(self) -> None:
        """Add a warning when the residuals exceed POOR_FIT_RMS / POOR_FIT_MAX."""
        rms, worst = self.rms_relative_error, self.max_relative_error
        if rms is None:
            return
        if rms > POOR_FIT_RMS or worst > POOR_FIT_MAX:
            bad = max(self.points, key=lambda p: abs(p.relative_error))
            self.warnings.append(f"poor fit of {self.quantity}: rms error {rms:.0%}, worst {worst:.0%} at "
                                 f"{bad.label} ({bad.source}); the model misses part of this behaviour")

    def summary(self) -> dict:
        """Plain data for the profile's provenance."""
        out = {"method": self.method, "points": len(self.points), "params": self.params}
        if self.points:
            out["rms_relative_error"] = round(self.rms_relative_error, 4)
            out["max_relative_error"] = round(self.max_relative_error, 4)
        if self.warnings:
            out["warnings"] = list(self.warnings)
        if self.notes:
            out["notes"] = list(self.notes)
        return out
