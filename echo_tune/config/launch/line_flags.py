"""A launch line's indirect flags read as Megatron-LM reads them (training/arguments.py validate_args,
training/training.py and core/tokenizers/utils/build_tokenizer.py at d98e8a64ddf3): flags that set another
setting (--group-query-attention, --tokenizer-type, --recompute-activations, the 2020/2021 spellings), and
values Megatron normalises (--num-experts 0, a negative capacity factor). ``megatron_args.LINE_FLAGS`` lists
the flags and the values each takes."""

from __future__ import annotations

from echo_tune.config.specs.batch_schedule import final_global_batch_size
from echo_tune.config.launch.tokenizers import VOCAB_SIZE_TOKENIZERS, tokenizer_vocab_size
from echo_tune.errors import ConfigError
from echo_tune.config.launch.ub_config import read_ub_config


def _int(flag: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{flag} takes an integer, but got ({flag}={raw!r})") from None


def apply_line_flags(flags: dict[str, list[str]], model: dict, parallel: dict, ignored: list[str], base=None) -> None:
    """Megatron's own reading of the indirect flags (see LINE_FLAGS)."""
    _query_groups(flags, model, ignored, base)
    _vocabulary(flags, model, ignored)
    if "--use-rotary-position-embeddings" in flags:
        model["position_embedding_type"] = "rope"  # arguments.py validate_args: overrides --position-embedding-type
    if model.get("num_experts") == 0:  # arguments.py validate_args: `if args.num_experts == 0: None`
        model["num_experts"] = None
    factor = model.get("moe_expert_capacity_factor")
    if factor is not None and factor < 0:  # transformer_config.py __post_init__: a negative factor is dropless
        model["moe_expert_capacity_factor"] = None
    if "--step-batch-size-schedule" in flags:
        schedule = " ".join(flags["--step-batch-size-schedule"])
        if "global_batch_size" in parallel:  # training/arguments.py validate_args
            raise ConfigError(f"--step-batch-size-schedule and --global-batch-size cannot both be given (Megatron-LM "
                              f"refuses it), but got ({schedule!r}, {parallel['global_batch_size']}); drop one")
        parallel["global_batch_size"] = final_global_batch_size(schedule)
        ignored.append(f"--step-batch-size-schedule (simulated at its steady state, the final global batch size "
                       f"{parallel['global_batch_size']})")
    if "--tp-comm-overlap-cfg" in flags:  # the file's contents, as training/initialize.py hands them to TE

        parallel["tp_comm_overlap_cfg"] = read_ub_config(flags["--tp-comm-overlap-cfg"][0])
    if "--recompute-activations" in flags:  # arguments.py validate_args sets selective, whatever else is given
        parallel["recompute_granularity"] = "selective"
    if "--activations-checkpoint-method" in flags:
        parallel["recompute_granularity"] = "full"
        parallel.setdefault("recompute_method", flags["--activations-checkpoint-method"][0])
    if "--no-scatter-gather-tensors-in-pipeline" in flags:  # arguments.py 72e4230bb5..10e7b74597: store_false
        if parallel.get("scatter_gather_tensors_in_pipeline"):
            raise ConfigError("--scatter-gather-tensors-in-pipeline (Megatron-LM 27fc468964..72e4230bb5) and "
                              "--no-scatter-gather-tensors-in-pipeline (72e4230bb5..10e7b74597) were never flags of "
                              "one Megatron-LM version, but both are given; keep one")
        parallel["scatter_gather_tensors_in_pipeline"] = False
    for legacy in ("--activations-checkpoint-num-layers", "--checkpoint-num-layers"):
        if legacy in flags and "recompute_num_layers" not in parallel:
            parallel["recompute_num_layers"] = _int(legacy, flags[legacy][0])


def _query_groups(flags: dict, model: dict, ignored: list[str], base) -> None:
    """Megatron trains grouped-query attention only with --group-query-attention (training.py: else
    num_query_groups = num_attention_heads), with --num-query-groups' default of 1 group; a model laid under
    the line (``base``) counts its own --group-query-attention as given."""
    base_gqa = base is not None and base.query_groups != base.num_attention_heads  # its line has the flag
    if not ("--group-query-attention" in flags or base_gqa) and model.get("num_query_groups") is not None:
        model["num_query_groups"] = None
        ignored.append("--num-query-groups (no --group-query-attention: Megatron trains MHA)")
    if "--group-query-attention" in flags and "num_query_groups" not in model and not base_gqa:
        model["num_query_groups"] = 1  # arguments.py: --num-query-groups defaults to 1
        ignored.append("--group-query-attention without --num-query-groups: one key/value group, Megatron's "
                       "default (multi-query attention)")


def _vocabulary(flags: dict, model: dict, ignored: list[str]) -> None:
    """The vocabulary as Megatron builds it: from the tokenizer (core/tokenizers/utils/build_tokenizer.py at
    d98e8a64ddf3 reads --vocab-size only for NullTokenizer and TikTokenizer); --vocab-size alone stands for it."""
    tokenizer = (flags.get("--tokenizer-type") or ["GPT2BPETokenizer" if "--merge-file" in flags else None])[0]
    if tokenizer is None or (tokenizer in VOCAB_SIZE_TOKENIZERS and "vocab_size" in model):
        return
    try:
        size = tokenizer_vocab_size(tokenizer, (flags.get("--tokenizer-model") or [None])[0])
    except ConfigError:
        if "vocab_size" in model:  # a tokenizer echo-tune cannot size: --vocab-size is taken as its length
            return
        raise
    if "vocab_size" in model and model["vocab_size"] != size:
        ignored.append(f"--vocab-size {model['vocab_size']} (Megatron takes the vocabulary from --tokenizer-type "
                       f"{tokenizer}: {size} tokens)")
    model["vocab_size"] = size


def drop_unused_recompute(parallel: dict) -> list[str]:
    """Without a recompute granularity Megatron checks and uses neither --recompute-method nor
    --recompute-num-layers (TransformerConfig judges them only with a granularity): dropped from the settings
    in effect (a launch line merged with the CLI's own flags), with a note for each."""
    notes = []
    if parallel.get("recompute_granularity") is None:
        for field in ("recompute_method", "recompute_num_layers"):
            if parallel.pop(field, None) is not None:
                notes.append(f"--{field.replace('_', '-')} (no --recompute-granularity: Megatron ignores it)")
    return notes
