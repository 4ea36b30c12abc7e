"""A ``plan`` candidate, ``CLUSTER:GPUS[:PRICE][:PRECISION]`` (``h100:256:2.49:fp8``), read and checked: the GPU
count and the price of one GPU-hour within ``echo_tune.limits`` (no NaN, inf or 1e300 prices), the cluster loaded,
and a precision the GPU has."""

from __future__ import annotations

from dataclasses import dataclass

from echo_tune.config.load.loading import load_cluster
from echo_tune.config.flags.unmodelled import UnmodelledError
from echo_tune.errors import ConfigError, EchoTuneError
from echo_tune.limits import check_number

PRECISION_WORDS = {"fp8": "auto", "auto": "auto", "hybrid": "hybrid", "e4m3": "e4m3", "bf16": "none",
                   "none": "none"}
"""A candidate's optional precision (``h100:256:2.49:fp8``) -> its ``--fp8-format``: fp8 searches BF16 and
FP8 hybrid (the fastest wins), hybrid or e4m3 fixes the format, bf16 searches BF16 alone."""


@dataclass(frozen=True, kw_only=True)
class PlanCandidate:
    cluster: str
    num_gpus: int
    gpu_hour_price: float | None = None
    fp8_format: str | None = None
    """``--fp8-format`` of this candidate's search (FP8_CHOICES); None: the plan's ``--fp8-format``."""
    precision_word: str | None = None
    """The precision as the candidate wrote it (fp8, bf16, hybrid, ...), shown in its name."""

    @property
    def name(self) -> str:
        return f"{self.num_gpus} x {self.cluster}" + (f" {self.precision_word}" if self.precision_word else "")


def parse_candidate(text: str) -> PlanCandidate:
    """``CLUSTER:GPUS[:PRICE][:PRECISION]``, e.g. ``h100:256:2.49:fp8`` (price of one GPU-hour, in the plan's
    currency; precision fp8, bf16, hybrid or e4m3, see PRECISION_WORDS)."""
    parts = str(text).split(":")
    shown = repr(str(text)) if len(str(text)) <= 80 else repr(str(text)[:77]) + "..."  # one readable line
    word = None
    if len(parts) in (3, 4) and parts[-1].lower() in PRECISION_WORDS:
        word = parts.pop().lower()
    if len(parts) not in (2, 3) or not parts[0]:
        raise ConfigError(f"a candidate must be CLUSTER:GPUS[:PRICE][:PRECISION] such as h100:256:2.49:fp8 "
                          f"(PRECISION one of {sorted(PRECISION_WORDS)}), but got ({shown})")
    try:
        gpus = int(parts[1])
        price = float(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ConfigError(f"a candidate must be CLUSTER:GPUS[:PRICE][:PRECISION] with an integer GPU count, a "
                          f"number as price and a precision in {sorted(PRECISION_WORDS)}, but got ({shown})") from None
    if gpus <= 0 or (price is not None and price <= 0):
        raise ConfigError(f"`GPUS > 0` and `PRICE > 0` must hold in a candidate, but got ({shown})")
    try:  # NaN, inf, 1e300 a GPU-hour, more GPUs than any cluster: the ranges of echo_tune.limits, as rank files
        check_number("num_gpus", gpus)
        if price is not None:
            check_number("gpu_hour_cost", price, flag="PRICE")
    except ConfigError as exc:
        raise ConfigError(f"candidate {shown}: {exc}") from None
    cluster = load_cluster(parts[0])  # a bad cluster fails here with its one-line error
    fp8 = PRECISION_WORDS[word] if word else None
    if fp8 not in (None, "none") and cluster.gpu.peak_fp8_tflops is None:
        raise ConfigError(f"candidate {shown} asks for {word}, but {cluster.gpu.name} has no FP8 tensor cores; "
                          f"drop ':{word}' or pick an H100, H200 or B200")
    return PlanCandidate(cluster=parts[0], num_gpus=gpus, gpu_hour_price=price, fp8_format=fp8, precision_word=word)


def bad_row(name: str, error: Exception, candidate: PlanCandidate | None = None, cluster=None) -> dict:
    """The planner's row of a candidate that cannot be planned: its reason (``refused: ...`` for a setting that
    shapes the step but is not modelled, ``invalid: ...`` otherwise) and no layout, time or cost."""
    verdict = "refused" if isinstance(error, UnmodelledError) else "invalid"
    return {"candidate": name, "cluster": cluster.name if cluster is not None else None,
            "gpu": cluster.gpu.name if cluster is not None else None,
            "num_gpus": candidate.num_gpus if candidate is not None else None,
            "gpu_hour_price": candidate.gpu_hour_price if candidate is not None else None, "currency": None,
            "feasible": False, "error": f"{verdict}: {error}", "error_band": None, "layout": None,
            "step_time_s": None, "tokens_per_s": None, "mfu": None, "days": None, "gpu_hours": None, "cost": None,
            "headroom_gib": None, "meets_deadline": None, "within_budget": None, "precision": None,
            "near_tie": None, "closest_miss": None, "fit_hint": None}


def parse_candidates(texts: list[str]) -> tuple[list[PlanCandidate], list[dict]]:
    """Every ``--candidate`` read: the good ones, and a row (``bad_row``) for each that cannot be (checked all
    before any is searched)."""
    good, bad = [], []
    for text in texts:
        try:
            good.append(parse_candidate(text))
        except EchoTuneError as exc:
            shown = str(text) if len(str(text)) <= 80 else str(text)[:77] + "..."
            bad.append(bad_row(shown, exc))
    return good, bad
