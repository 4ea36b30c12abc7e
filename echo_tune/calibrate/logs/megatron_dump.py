"""A Megatron-LM argument dump read the way Megatron-LM itself resolves it (d98e8a64ddf3).

``_print_args`` (megatron/training/arguments.py) prints every attribute of ``args`` after ``validate_args``:
every argument, set or not, at its resolved value. So a dump names settings Megatron never reads, settings
``validate_args`` derived, and the defaults of everything. Read as a runs-CSV row, what the model takes is:

- ``use_flash_attn``: defined, read nowhere in Megatron-LM d98e8a64ddf3 (``git grep use_flash_attn megatron/``
  finds only the ``add_argument``); ``attention_backend`` decides (auto / flash / fused: Transformer Engine's
  flash or cuDNN fused attention, flash-style kernels). The dump prints ``False`` for every run that did not
  pass the old flag, which read as unfused attention (issue 40).
- ``num_query_groups``: Megatron passes it to the model only with ``group_query_attention``
  (training/argument_utils.py ``core_transformer_config_from_args``: else ``None``, i.e. one group per head);
  the dump prints its default, 1, for every model without GQA.
- ``layernorm_zero_centered_gamma`` is ``--apply-layernorm-1p``'s dest, ``layernorm_epsilon``
  ``--norm-epsilon``'s, ``fp8`` ``--fp8-format``'s, ``fp4`` ``--fp4-format``'s.
- dtypes: ``validate_args`` maps ``--main-grads-dtype fp32`` etc. to ``torch.float32`` (its ``dtype_map``).
- precision: ``bf16`` / ``fp16`` flags, FP8 on top through ``fp8``, NVFP4 through ``fp4`` / ``fp4_recipe``.

Every other printed argument whose flag shapes the step but is not modelled (config/flags/unmodelled.py) refuses the
run by name when its value is not Megatron's (resolved) default (e.g. ``cp_comm_type ['a2a']``); an FP4 run
(``fp4 e2m1``) is read as NVFP4, never fitted as BF16.
"""

from __future__ import annotations

from functools import lru_cache

from echo_tune.config.flags.flag_catalog import megatron_flags
from echo_tune.config.flags.unmodelled import STEP_SHAPING_FLAGS, VALUE_RULES, classes_of, modelled_flags

IGNORED = {"use_flash_attn": "Megatron-LM d98e8a64ddf3 reads --use-flash-attn nowhere; attention_backend decides"}
RENAMED = {"fp8": "fp8_format", "fp4": "fp4_format", "layernorm_zero_centered_gamma": "apply_layernorm_1p",
           "layernorm_epsilon": "norm_epsilon"}
# training/arguments.py validate_args dtype_map, inverted ('auto' and None print as None: not set)
TORCH_DTYPES = {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.uint8": "fp8"}
# Megatron-LM d98e8a64ddf3 defaults that are neither None nor False, of the arguments whose flags shape the step
# unmodelled (argparse's default of each dest, printed as _print_args prints it; regenerate with
# tests/calibrate/data/megatron_logs/make_logs.py --defaults). Every other such argument defaults to None / False.
DEFAULTS = {
    "align_grad_reduce": "True", "align_param_gather": "True", "clone_scatter_output_in_embedding": "True",
    "cp_comm_type": "['p2p']", "cpu_offloading_num_layers": "0", "ddp_param_name_patterns_for_fp32_local_accumulation":
    "[]", "distributed_backend": "nccl", "fp4_recipe": "nvfp4", "fp8_wgrad": "True", "gradient_reduce_div_fusion": "True",
    "gtp_remat_opt_in_modules": "[]", "high_priority_stream_groups": "[]", "mlp_chunks_for_training": "1",
    "moe_combine_bwd_dtype": "bf16", "moe_dispatch_fwd_dtype": "bf16", "moe_hybridep_num_sms_preprocessing": "108",
    "muon_fp32_matmul_prec": "medium", "overlap_p2p_comm": "True", "pad_vocab_size": "True",
    "rerun_mode": "validate_results", "torch_fsdp2_reshard_after_forward": "True", "tp_comm_bulk_dgrad": "True",
    "tp_comm_bulk_wgrad": "True", "tp_comm_overlap_ag": "True", "tp_comm_overlap_rs": "True",
    "tp_comm_split_ag": "True", "tp_comm_split_rs": "True"}
UNSET = ("None", "False", "[]", "")


def _no_interleaving(args: dict[str, str]) -> str | None:
    # validate_args: without an interleaved schedule `args.overlap_p2p_comm = False; args.align_param_gather = False`
    return "False" if args.get("virtual_pipeline_model_parallel_size", "None") == "None" else None


def _times(a: str, b: str):
    def value(args: dict[str, str]) -> str | None:
        try:
            return str(int(args.get(a, "1")) * int(args.get(b, "1")))
        except ValueError:
            return None
    return value


# Arguments validate_args derives from others: the derived value is Megatron's resolution, not a setting
RESOLVED = {
    "encoder_num_layers": lambda args: args.get("num_layers"),  # = num_layers (validate_args)
    "encoder_seq_length": lambda args: args.get("seq_length"),  # = seq_length
    "overlap_p2p_comm": _no_interleaving, "align_param_gather": _no_interleaving,
    # core/model_parallel_config.py resolve_tensor_parallel_weight_shards: None -> TP x GTP remat size
    "tensor_parallel_num_weight_shards": _times("tensor_model_parallel_size", "gtp_weight_remat_size"),
    "expert_tensor_parallel_num_weight_shards": _times("expert_tensor_parallel_size", "expert_gtp_weight_remat_size"),
}


@lru_cache(maxsize=None)
def _flags_by_dest() -> dict[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for flag, info in megatron_flags().items():
        out.setdefault(info["dest"], []).append(flag)
    return {dest: tuple(flags) for dest, flags in out.items()}


def text(value: str) -> str | None:
    """A dump value as a runs-CSV cell; None for Python's None."""
    if value in ("None", ""):
        return None
    if value in TORCH_DTYPES:
        return TORCH_DTYPES[value]
    if value.startswith("torch."):
        return value[len("torch."):]
    head, _, tail = value.partition(".")
    if tail and head[:1].isupper() and head.isidentifier() and tail.isidentifier():  # AttnBackend.auto -> auto
        return tail
    return value


def columns(args: dict[str, str], fields) -> dict[str, str]:
    """The dump's arguments that are runs-CSV columns (``fields``: the ModelSpec / ParallelConfig names), as
    Megatron resolves them, plus ``precision``."""
    row = {}
    for name, value in args.items():
        column = RENAMED.get(name, name)
        if name in IGNORED or column not in fields:
            continue
        cell = text(value)
        if cell is not None:
            row[column] = cell
    if args.get("group_query_attention") != "True":
        row.pop("num_query_groups", None)  # not passed to the model without GQA: one group per head
    if row.get("virtual_pipeline_model_parallel_size"):  # resolved from either spelling (validate_args)
        row.pop("num_layers_per_virtual_pipeline_stage", None)
    row["precision"] = "bf16" if args.get("bf16") == "True" else "fp16" if args.get("fp16") == "True" else "fp32"
    return row


def unmodelled(args: dict[str, str]) -> list[tuple[str, str, str]]:
    """(argument, flag, why) of every printed argument that sets a step-shaping setting echo-tune does not
    model: its flag is classified step-shaping, out of scope or value-ruled, and the value is not Megatron's
    (resolved) default."""
    found = []
    modelled = modelled_flags()
    for name, value in args.items():
        flags = _flags_by_dest().get(name, ())
        if not flags or any(f in modelled for f in flags) or name in IGNORED:
            continue
        shaping = [f for f in flags if f in STEP_SHAPING_FLAGS]
        if not shaping:
            continue
        resolved = RESOLVED[name](args) if name in RESOLVED else None
        default = DEFAULTS.get(name)
        if value == resolved or value == default or (default is None and value in UNSET):
            continue
        flag = shaping[0]
        if flag in VALUE_RULES:
            if value in VALUE_RULES[flag]:
                continue
            why = f"echo-tune models {flag} {' / '.join(VALUE_RULES[flag])} only"
        else:
            kind, reason = next((c for c in classes_of(flag) if c[0] in ("step_shaping", "out_of_scope")),
                                ("step_shaping", "unclassified"))
            why = (f"it shapes the step ({reason}), which echo-tune does not model" if kind == "step_shaping"
                   else f"it means {reason}, out of echo-tune's scope")
        found.append((name, flag, why))
    return found
