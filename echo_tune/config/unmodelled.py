"""Megatron-LM flags echo-tune does not model, in two kept lists, so that nothing is dropped silently.

- ``HARMLESS``: flags that do not change a step's compute, memory or communication (paths, logging,
  checkpointing, data loading, tokenizer files, seeds, learning-rate schedule, initialisation, router
  scoring variants whose cost is a few elementwise ops on [tokens, experts]). They are ignored with a note.
- ``STEP_SHAPING``: flags that change compute, memory or communication in ways echo-tune does not model.
  A launch line, rank candidate, runs-CSV row or YAML model/layout that sets one is refused by name.
- ``VALUE_RULES``: flags whose default value is what echo-tune models and any other value is not.

A flag in none of the lists and not modelled (``megatron_args.py``) is refused too, as unknown: echo-tune
cannot tell whether it shapes the step. Flag names: megatron/training/arguments.py and the
TransformerConfig / DistributedDataParallelConfig fields it turns into flags (ArgumentGroupFactory),
NVIDIA/Megatron-LM commit d98e8a64ddf3.
"""

from __future__ import annotations

from echo_tune.errors import ConfigError


class UnmodelledError(ConfigError):
    """A setting that shapes the step but is not modelled (or is unknown): refused, never ignored."""


def _flags(text: str) -> frozenset[str]:
    return frozenset(text.split())


HARMLESS = {
    "paths, checkpointing": _flags("""--save --load --save-interval --no-load-optim --no-load-rng --no-save-optim
        --no-save-rng --ckpt-format --auto-detect-ckpt-format --dist-ckpt-strictness --use-dist-ckpt
        --finetune --pretrained-checkpoint --ckpt-fully-parallel-save --ckpt-fully-parallel-load
        --async-save --ckpt-assume-constant-structure --exit-interval --exit-duration-in-mins
        --exit-signal-handler --use-checkpoint-args --non-persistent-save-interval"""),
    "logging, profiling": _flags("""--log-interval --tensorboard-dir --wandb-project --wandb-exp-name --wandb-save-dir
        --log-timers-to-tensorboard --log-memory-to-tensorboard --log-num-zeros-in-grad --log-params-norm
        --log-validation-ppl-to-tensorboard --log-throughput --logging-level --log-progress
        --tensorboard-log-interval --timing-log-level --log-loss-scale-to-tensorboard
        --log-world-size-to-tensorboard --moe-per-layer-logging --profile --profile-step-start
        --profile-step-end --profile-ranks --use-pytorch-profiler --record-memory-history"""),
    "data, tokenizer, evaluation": _flags("""--data-path --split --data-cache-path --num-workers --mock-data
        --no-mmap-bin-files --no-create-attention-mask-in-dataloader --tokenizer-type --tokenizer-model
        --vocab-file --merge-file --train-data-path --valid-data-path --test-data-path --data-args-path
        --eval-interval --eval-iters --skip-train --reset-position-ids --reset-attention-mask
        --eod-mask-loss --dataloader-type"""),
    "optimizer hyper-parameters and schedule (same kernels, other numbers)": _flags("""--lr --min-lr
        --lr-decay-style --lr-decay-iters --lr-decay-samples --lr-warmup-iters --lr-warmup-samples
        --lr-warmup-init --lr-warmup-fraction --weight-decay --clip-grad --adam-beta1 --adam-beta2 --adam-eps
        --train-iters --train-samples --start-weight-decay --end-weight-decay --weight-decay-incr-style
        --loss-scale --initial-loss-scale --min-loss-scale --loss-scale-window --hysteresis
        --no-check-for-nan-in-loss-and-grad --calculate-per-token-loss --mtp-loss-scaling-factor"""),
    "initialisation, seeds, numerics constants": _flags("""--seed --init-method-std --init-method-xavier-uniform
        --rotary-base --rotary-scaling-factor --mscale --mscale-all-dim --norm-epsilon
        --max-position-embeddings --no-position-embedding --use-rotary-position-embeddings
        --attention-softmax-in-fp32 --no-masked-softmax-fusion --apply-query-key-layer-scaling
        --tiktoken-pattern
        --use-cpu-initialization --init-model-with-meta-device --use-mcore-models --enable-experimental
        --distributed-timeout-minutes --distributed-backend --manual-gc --manual-gc-interval --use-legacy-models"""),
    "MoE router scoring (elementwise on [tokens, experts]; balanced routing is assumed)": _flags("""
        --moe-aux-loss-coeff --moe-z-loss-coeff --moe-input-jitter-eps --moe-router-score-function
        --moe-router-pre-softmax --moe-router-topk-scaling-factor --moe-router-enable-expert-bias
        --moe-router-bias-update-rate --moe-router-group-topk --moe-router-num-groups
        --moe-router-force-load-balancing --moe-token-drop-policy --moe-permute-fusion"""),
    "FP8 delayed-scaling numerics (amax history and margin: the same kernels, other numbers)": _flags("""
        --fp8-margin --fp8-amax-history-len --fp8-amax-compute-algo"""),
    "flex dispatcher backend (the flex dispatcher is timed as alltoall, see workload/moe.py)": _flags("""
        --moe-flex-dispatcher-backend"""),
}
"""Ignored with a note, by reason."""

# FP8 (--fp8-format, --fp8-recipe, --fp8-param-gather, --first-last-layers-bf16 and its layer counts),
# --attention-backend, --grad-reduce-in-bf16, --recompute-activations, --account-for-*-in-pipeline-split
# and the precision-aware optimizer dtypes are modelled (config/megatron_args.py), so they are in no list.
STEP_SHAPING = {
    "FP4 training (FP4 GEMMs and weights)": _flags("""--fp4-format --fp4-recipe --fp4-param"""),
    "attention variant": _flags("""--window-size --window-attn-skip-freq --softmax-type
        --attention-output-gate --experimental-attention-variant --linear-attention-freq --no-rope-freq
        --cp-comm-type --hierarchical-context-parallel-sizes"""),
    "Mamba / hybrid or heterogeneous layers": _flags("""--hybrid-layer-pattern --hybrid-override-pattern
        --is-hybrid-model --spec --mamba-state-dim --mamba-head-dim --mamba-num-groups --mamba-num-heads
        --heterogeneous-layers-config-path --pipeline-model-parallel-layout"""),
    "FSDP (parameters and gradients sharded, all-gathered per layer)": _flags("""--use-megatron-fsdp
        --use-torch-fsdp2 --use-custom-fsdp --data-parallel-sharding-strategy --fsdp-double-buffer
        --megatron-fsdp-grad-comm-dtype --megatron-fsdp-main-grads-dtype"""),
    "CPU offload": _flags("""--cpu-offloading --cpu-offloading-num-layers --optimizer-cpu-offload
        --optimizer-offload-fraction --fine-grained-activation-offloading --offload-modules"""),
    "MoE overlap, latent or quantised routing": _flags("""--moe-shared-expert-overlap
        --overlap-moe-expert-parallel-comm --delay-wgrad-compute --moe-latent-size --moe-enable-deepep
        --moe-router-padding-for-quantization --moe-paged-stash
        --moe-use-legacy-grouped-gemm --expert-tensor-parallel-num-weight-shards --moe-layer-recompute"""),
    "recompute, pipeline and gradient settings": _flags("""--distribute-saved-activations
        --microbatch-group-size-per-virtual-pipeline-stage --overlap-p2p-communication-warmup-flush
        --defer-embedding-wgrad-compute --wgrad-deferral-limit --ddp-bucket-size
        --num-distributed-optimizer-instances --use-sharp --no-gradient-accumulation-fusion
        --cross-entropy-loss-fusion --cross-entropy-fusion-impl"""),
    "optimizer state precision": _flags("""--main-grads-dtype"""),
    "kernels and graphs": _flags("""--cuda-graph-impl --enable-cuda-graph --external-cuda-graph --use-nccl-ub
        --tp-comm-overlap-cfg --tensor-parallel-num-weight-shards"""),
    "kernel fusion turned off (more, unfused elementwise kernels)": _flags("""--no-rope-fusion
        --no-bias-swiglu-fusion --no-bias-gelu-fusion --no-bias-dropout-fusion --no-persist-layer-norm
        --rotary-seq-len-interpolation-factor"""),
}
"""Refused by name, by reason."""

VALUE_RULES = {
    "--transformer-impl": ("transformer_engine",),
    "--optimizer": ("adam",),
    "--rotary-percent": ("1.0", "1"),  # partial rotary embeddings are not modelled
}
"""Flag -> the values echo-tune models (Megatron's defaults); any other value is refused."""

_HARMLESS = {flag: reason for reason, flags in HARMLESS.items() for flag in flags}
_STEP_SHAPING = {flag: reason for reason, flags in STEP_SHAPING.items() for flag in flags}
assert not set(_HARMLESS) & set(_STEP_SHAPING), "a flag cannot be both harmless and step-shaping"
STEP_SHAPING_FLAGS = frozenset(_STEP_SHAPING) | frozenset(VALUE_RULES)


def refusal(flag: str, values: tuple[str, ...] = ()) -> str | None:
    """Why ``flag`` (with its values) is refused, or None when it is harmless."""
    if flag in _STEP_SHAPING:
        return (f"`{flag}` shapes the step ({_STEP_SHAPING[flag]}) but is not modelled by echo-tune; "
                f"remove it to simulate without it")
    if flag in VALUE_RULES:
        allowed = VALUE_RULES[flag]
        bad = [v for v in values if v not in allowed]
        if bad or not values:
            return (f"`{flag} {' '.join(values)}` is not modelled (echo-tune models {flag} "
                    f"{' / '.join(allowed)} only); remove it or use that value")
        return None
    if flag in _HARMLESS:
        return None
    return (f"`{flag}` is not a Megatron-LM flag echo-tune knows (neither modelled nor listed in "
            f"config/unmodelled.py), so it cannot tell whether it shapes the step; remove it")


def harmless_reason(flag: str) -> str | None:
    return _HARMLESS.get(flag)


def refuse_if_unmodelled(flag: str, values: tuple[str, ...] = ()) -> None:
    reason = refusal(flag, values)
    if reason is not None:
        raise UnmodelledError(reason)


def refuse_unmodelled_keys(keys, known, what: str) -> None:
    """A YAML / CSV key named after a step-shaping Megatron setting that echo-tune does not model is
    refused by name (other unknown keys are left to the caller's unknown-key error)."""
    for key in keys:
        flag = "--" + str(key).replace("_", "-")
        if key not in known and flag in STEP_SHAPING_FLAGS:
            raise UnmodelledError(f"{what}: key {key!r} ({flag}) shapes the step but is not modelled by "
                                  f"echo-tune; remove it")
