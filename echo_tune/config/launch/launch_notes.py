"""What a Megatron-LM launch line of a layout must say that its settings leave unsaid: the full-recompute
defaults, pairs Megatron-LM's arguments.py refuses but Megatron-Core accepts, and the legacy layout switches.

Notes for the report (sim/simulate.py) and ``megatron_args.txt`` (search/outputs/write.py), not checks: the launch
line's checks are config/rules/launch_rules.py's, run where the line is parsed.
"""

from __future__ import annotations

import functools

from echo_tune.config.launch.megatron_flag_tables import PARALLEL_FLAGS
from echo_tune.config.flags.unmodelled import LEGACY


@functools.cache
def _legacy_switches() -> tuple[tuple[str, bool, str, str], ...]:
    """(field, the value that writes the flag, flag, why) of the layout switches whose flag is a legacy spelling
    (config/data/megatron_flag_classes.yaml): --no-async-tensor-model-parallel-allreduce and
    --scatter-gather-tensors-in-pipeline."""
    return tuple((field, kind == "flag", flag, LEGACY[flag]) for field, (flag, kind) in PARALLEL_FLAGS.items()
                 if flag in LEGACY and kind in ("flag", "not_flag"))


def launch_notes(settings: dict) -> tuple[str, ...]:
    """What a Megatron-LM launch line of ``settings`` (ParallelConfig fields by name) must say that the settings
    leave unsaid, or cannot say: the full-recompute defaults, a pair Megatron-LM's argument check refuses, and
    the legacy flags that state how older Megatron-LM code ran (the reference commit no longer has them)."""
    notes = [f"{flag} simulates older Megatron-LM code ({why}); Megatron-LM at d98e8a64ddf3 does not accept it: "
             f"drop it to launch today's Megatron-LM, which runs without it"
             for field, on, flag, why in _legacy_switches() if settings.get(field) is on]
    method, layers = settings.get("recompute_method"), settings.get("recompute_num_layers")
    if settings.get("recompute_granularity") == "full" and (method is None or layers is None):
        notes.append(f"full recompute without recompute_method / recompute_num_layers is simulated as "
                     f"{method or 'uniform'}, {layers or 1} layer(s) per checkpoint; Megatron-Core refuses it "
                     f"without both, so the launch flags state them")
    model = settings.get("model_spec") or {}
    if model.get("cross_entropy_loss_fusion") and model.get("cross_entropy_fusion_impl") == "te":
        notes.append("--cross-entropy-loss-fusion with --cross-entropy-fusion-impl te: Megatron-LM's arguments.py "
                     "refuses this pair (TE's fusion 'disabled due to stability issues'); Megatron-Core's config, as "
                     "Megatron-Bridge sets it, accepts it; for pretrain_gpt.py write --cross-entropy-fusion-impl "
                     "native")
    if settings.get("overlap_param_gather") and not settings.get("overlap_grad_reduce"):
        notes.append("overlap_param_gather without overlap_grad_reduce: Megatron-LM's arguments.py refuses this "
                     "pair ('Must use --overlap-param-gather with --overlap-grad-reduce'); Megatron-Core's "
                     "DistributedDataParallelConfig, as Megatron-Bridge sets it, accepts it")
    return tuple(notes)
