"""Range limits for every number that enters echo-tune, in one place, each with its reason.

Limits are generous on purpose: no real cluster, model or run is refused; they only stop values that
are nonsense (NaN, inf, negative counts) or that would make one command run for hours or take a
machine's memory (issue 10). ``check_number`` raises a one-line ConfigError naming the key, the
value, the rule and the fix; the CLI applies it to every numeric flag by destination name
(``echo_tune.cli.checked_args``), and file loaders call it for their keys.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from echo_tune.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Limit:
    low: float
    """Smallest allowed value."""
    high: float
    """Largest allowed value."""
    integer: bool = False
    """Whole numbers only."""
    low_open: bool = False
    """``low`` itself is not allowed (``value > low``)."""
    reason: str = ""
    """Why these bounds (the source of the range)."""

    def rule(self, key: str) -> str:
        fmt = (lambda x: str(int(x))) if self.integer else (lambda x: f"{x:g}")
        return f"`{fmt(self.low)} {'<' if self.low_open else '<='} {key} <= {fmt(self.high)}`"


# The largest training clusters published by 2026 hold ~100k GPUs (xAI Colossus, Meta's 2x24k
# clusters); 2**20 leaves a 10x margin.
_MAX_GPUS = 2**20
_YEAR_S = 365 * 24 * 3600.0

LIMITS: dict[str, Limit] = {
    "num_gpus": Limit(low=1, high=_MAX_GPUS, integer=True,
                      reason="10x the largest published training cluster (~100k GPUs)"),
    "n_trials": Limit(low=1, high=10**7, integer=True,
                      reason="a study of 10M trials is ~10 GB of journal; more is a typo"),
    "n_jobs": Limit(low=1, high=4096, integer=True, reason="processes on one machine (4096 cores)"),
    "timeout": Limit(low=0, high=_YEAR_S, low_open=True, reason="seconds; more than a year is a typo"),
    "seed": Limit(low=0, high=2**32 - 1, integer=True, reason="numpy's RandomState seed range"),
    "top": Limit(low=0, high=10**6, integer=True, reason="rows of a printed table"),
    "gpu_hour_cost": Limit(low=0, high=1e6, low_open=True, reason="price of one GPU-hour in any currency; cloud list "
                                                   "prices are 1-100 USD (2026)"),
    "memory_headroom_gib": Limit(low=0, high=4096, reason="GiB; no GPU has more than 4 TiB of HBM"),
    "moe_routing_imbalance": Limit(low=1, high=1e6, reason="busiest expert's share over balanced; >= 1 "
                                                           "by definition"),
    "tokens": Limit(low=0, high=1e18, low_open=True, reason="training tokens; 1000x the largest "
                                                            "published run (~1e15)"),
    "max_error_pct": Limit(low=0, high=1e6, reason="percent"),
    "threads": Limit(low=1, high=4096, integer=True, reason="CPU threads on one machine"),
    "max_tiers": Limit(low=1, high=3, integer=True, reason="protocol tiers NCCL has (LL, LL128, Simple)"),
    "kernel_launch_overhead_s": Limit(low=0, high=1e-2, reason="a CUDA launch costs ~2-10 us (CUDA C++ Best "
                                                                "Practices Guide); 10 ms is 1000x that"),
    "hidden_dropout": Limit(low=0, high=1, reason="a probability"),
    "attention_dropout": Limit(low=0, high=1, reason="a probability"),
    "repeats": Limit(low=1, high=10**4, integer=True, reason="timed runs of one stage"),
    "stage": Limit(low=0, high=2**14, integer=True, reason="a pipeline stage index (< num_layers)"),
    "ranks_per_node": Limit(low=1, high=4096, integer=True, reason="GPUs of one node (72 in an NVL72 rack)"),
    "nproc_per_node": Limit(low=1, high=4096, integer=True, reason="GPUs of one node (72 in an NVL72 rack)"),
    "measured_step_time_s": Limit(low=1e-3, high=86400.0,
                                  reason="one training step: a millisecond is below any kernel launch sequence of a "
                                         "real step (a value in hours or days, or a unit slip), a day per step is a "
                                         "typo"),
    # Megatron-LM model and layout sizes: far above any published model (the largest dense
    # models have ~200 layers, hidden 2**15, sequences of 2**20 tokens, vocabularies of 2**18)
    "num_layers": Limit(low=1, high=2**14, integer=True, reason="100x the deepest published model"),
    "hidden_size": Limit(low=1, high=2**20, integer=True, reason="32x the widest published model"),
    "ffn_hidden_size": Limit(low=1, high=2**22, integer=True, reason="32x the widest published FFN"),
    "num_attention_heads": Limit(low=1, high=2**16, integer=True, reason="far above any published model"),
    "num_query_groups": Limit(low=1, high=2**16, integer=True, reason="at most the number of heads"),
    "kv_channels": Limit(low=1, high=2**16, integer=True, reason="head dimension"),
    "seq_length": Limit(low=1, high=2**26, integer=True, reason="64x the longest published training "
                                                               "context (~1M tokens)"),
    "vocab_size": Limit(low=1, high=2**24, integer=True, reason="64x the largest published vocabulary"),
    "mtp_num_layers": Limit(low=1, high=2**10, integer=True, reason="multi-token-prediction layers; published "
                            "models have 1 to 3 (DeepSeek-V3 1), and each is a full layer with its own output head"),
    "num_experts": Limit(low=1, high=2**16, integer=True, reason="far above any published MoE (256)"),
    "micro_batch_size": Limit(low=1, high=2**20, integer=True, reason="sequences per micro-batch"),
    # one step of 2**40 sequences is ~1e15 tokens: a whole training run, not a step
    "global_batch_size": Limit(low=1, high=2**40, integer=True, reason="a step larger than any whole "
                                                                     "training run"),
}

# Hardware numbers a cluster file, a GPU mapping or a flag gives (issue 41): physical bounds with a wide margin
# over every datasheet of 2026 (GB300: 2,500 dense BF16 TFLOP/s, 15,000 dense FP4, 288 GB of HBM at 8 TB/s;
# NVLink 5: 900 GB/s per GPU and direction; NICs: 800 Gb/s), and floors below the slowest hardware one
# could run on (a CPU core, 100 Mb Ethernet), so the CPU test clusters (0.1 TFLOP/s, 10 GB/s) still read.
_TFLOPS = Limit(low=1e-3, high=1e5, reason="TFLOP/s; from 1 GFLOP/s (a CPU core) to 40x GB300's dense BF16 "
                                           "peak (2,500)")
HARDWARE_LIMITS: dict[str, Limit] = {
    "peak_bf16_tflops": _TFLOPS, "peak_fp16_tflops": _TFLOPS, "peak_fp32_tflops": _TFLOPS,
    "peak_fp8_tflops": _TFLOPS, "peak_fp4_tflops": _TFLOPS,
    "memory_bytes": Limit(low=1, high=2**42, integer=True, reason="bytes of HBM; no GPU has more than 4 TiB "
                                                                  "(GB300: 288 GB)"),
    "memory_bandwidth_gbyte_s": Limit(low=0.1, high=1e5, reason="GB/s of HBM; 12x GB300's 8,000 GB/s"),
    "sm_count": Limit(low=1, high=4096, integer=True, reason="streaming multiprocessors; GB300 has 160"),
    "peak_clock_mhz": Limit(low=100, high=6000, reason="MHz (not GHz); GPU SM clocks run from a few hundred MHz "
                                                       "to ~2,100 MHz (GB200 2,062)"),
    "sustained_clock_mhz": Limit(low=100, high=6000, reason="MHz (not GHz); the SM clock under load (--gpu-clock-mhz "
                                                            "or a cluster's `sustained_clock_mhz`) runs from a few "
                                                            "hundred MHz to ~2,100 MHz"),
    "gpus_per_node": Limit(low=1, high=4096, integer=True, reason="GPUs of one node (72 in an NVL72 rack)"),
    "nics_per_node": Limit(low=1, high=4096, integer=True, reason="NICs of one node (8 to 18 on GPU nodes)"),
    "intra_node_bandwidth_gbyte_s": Limit(low=0.1, high=1e4, reason="GB/s per GPU and direction; NVLink 5 gives "
                                                                    "900, PCIe 3 x1 ~1"),
    "nic_bandwidth_gbit_s": Limit(low=0.1, high=1e4, reason="Gb/s (bits) of one NIC; 12x an 800G NIC, above "
                                                            "100 Mb Ethernet"),
    "nodes_per_leaf": Limit(low=1, high=_MAX_GPUS, integer=True, reason="nodes under one leaf switch"),
    "nvlink_domain_size": Limit(low=1, high=_MAX_GPUS, integer=True, reason="GPUs of one NVLink domain (72 on "
                                                                           "NVL72, 576 at most in NVLink 5)"),
    "spine_oversubscription": Limit(low=1, high=1000, reason="leaf bandwidth over spine bandwidth; real fabrics "
                                                             "are 1:1 to about 1:8"),
}
LIMITS |= HARDWARE_LIMITS

# A calibration profile's numbers (cost/profile_bounds.py; issue 41): the rates and times a fit or a datasheet
# gives, bounded as the cluster's own numbers are (a profile's bandwidths are fractions of the links above).
_FRACTION = Limit(low=0, high=1, low_open=True, reason="a fraction of a datasheet peak, the rate a kernel reaches "
                                                       "over the peak rate")
_STEP_LATENCY = Limit(low=0, high=1.0, reason="seconds; NCCL's are 1-60 us, gloo over TCP ~100 us; a second is 10^4x "
                                              "that")
_SLOWDOWN = Limit(low=1, high=100, reason="a kernel's time beside communication over its time alone; Echo "
                                          "(arXiv 2412.12487) measures 1.0-1.5")
PROFILE_LIMITS: dict[str, Limit] = {
    "gemm_max_efficiency": _FRACTION, "fp8_gemm_max_efficiency": _FRACTION, "attention_efficiency": _FRACTION,
    "attention_backward_efficiency": _FRACTION,
    "attention_causal_factor": Limit(low=0, high=1, low_open=True, reason="a causal kernel's rate over an unmasked "
                                                                          "one's (0.85 measured on H100)"),
    "gemm_half_saturation_dim": Limit(low=1, high=2**20, reason="the GEMM dimension at half efficiency; one CTA "
                                                                "tile is 64-256"),
    "memory_bandwidth_gbyte_s": HARDWARE_LIMITS["memory_bandwidth_gbyte_s"],
    "kernel_launch_overhead_s": LIMITS["kernel_launch_overhead_s"],
    "latency_s": _STEP_LATENCY, "base_latency_s": _STEP_LATENCY,
    "bus_bandwidth_gbyte_s": Limit(low=1e-3, high=1e4, reason="GB/s of nccl-tests bus bandwidth; from 1 MB/s "
                                                              "(under 100 Mb Ethernet) to 11x NVLink 5's 900"),
    "tree_efficiency": Limit(low=0, high=4, low_open=True, reason="a two-node tree's NVLink chain over the ring "
                                                                  "(1: NCCL's own ratio; fitted 0.82 on NDv4)"),
    "compute_slowdown": _SLOWDOWN, "comm_slowdown": _SLOWDOWN,
    "amplitude": Limit(low=0, high=99, reason="a slowdown curve's rise over 1 at large messages (the slowdown "
                                              "itself stays within 1-100)"),
    "half_size_bytes": Limit(low=0, high=2**50, low_open=True, reason="bytes of the message at half the curve's "
                                                                     "rise; 1 PiB is no one collective"),
    "median": _SLOWDOWN,
    "sustained_clock_mhz": Limit(low=100, high=6000, reason="MHz (not GHz); a clock fitted on training runs is the "
                                                            "SM clock under load, a few hundred MHz to ~2,100 MHz"),
    "comm_time_factor": Limit(low=0.01, high=100, reason="a fitted factor on every collective's time; 1 leaves the "
                                                         "links as they are, 100x either way is a fit gone wrong"),
    "host_time_per_kernel_s": Limit(low=0, high=1e-2, reason="seconds the host takes to issue one kernel; fitted "
                                                             "38-79 us on published runs, 10 ms is 100x that"),
}
# the fastest boost clock over the clock the tensor-core peak is specified at: H100 SXM 1,980 / 1,830 MHz (1.08),
# B200 1,965 / 1,856 (1.06); a sustained clock above 1.1x the peak clock is a typo
MAX_CLOCK_OVER_PEAK = 1.1

# Work bounds (not input ranges): the simulator extrapolates long pipelines from a short periodic
# run; when it must simulate every task (a recorded timeline, or a pipeline whose steady state is
# not exactly periodic), this many micro-batches at most, so memory stays ~100 MB.
MAX_SIMULATED_MICRO_BATCHES = 2**16
# A search space is enumerated into its valid layouts up front (~75 us and ~1 KB each here): 500k is
# ~40 s and ~0.5 GB, 17x the largest shipped example (deepseek/gpt3 spaces hold <= 30k); more is refused
# with the way to narrow it, instead of running for minutes with nothing printed.
MAX_VALID_LAYOUTS = 500_000
# Rows of a runs CSV ``validate`` reads: each is one full simulation (~0.1-0.5 s here), so 2000 rows are
# minutes, 80x the shipped published-run files (25-27 rows); a 100k-row file would run for hours.
MAX_RUN_ROWS = 2_000


def check_number(key: str, value: object, limit: Limit | None = None, *, flag: str | None = None) -> None:
    """Raise a one-line ConfigError unless ``value`` is a finite number within ``LIMITS[key]``."""
    limit = limit or LIMITS.get(key)
    name = flag or key
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"`{name}` must be a number, but got ({name}={value!r}); give a number")
    if not math.isfinite(value):
        raise ConfigError(f"`{name}` must be finite, but got ({name}={value!r}); give a finite number")
    if limit is None:
        return
    if limit.integer and value != int(value):
        raise ConfigError(f"`{name}` must be a whole number, but got ({name}={value!r})")
    low_ok = value > limit.low if limit.low_open else value >= limit.low
    if not low_ok or value > limit.high:
        unit = ""
        if key.endswith("_mhz") and 0 < value < limit.low <= value * 1000 <= limit.high:  # 1.755 for 1,755 MHz
            unit = f"; {value:g} looks like GHz: give {value * 1000:g} (MHz)"
        raise ConfigError(f"{limit.rule(name)} must hold, but got ({name}={value!r}); give a value in range "
                          f"({limit.reason}){unit}")


def first_non_finite(data, where: str = "") -> tuple[str, float] | None:
    """The first NaN or infinity in a nested dict/list, as (dotted key, value)."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        name = f"{where}.{key}" if where else str(key)
        if isinstance(value, float) and not math.isfinite(value):
            return name, value
        found = first_non_finite(value, name) if isinstance(value, (dict, list)) else None
        if found:
            return found
    return None
