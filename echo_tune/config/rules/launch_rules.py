"""Megatron-LM's own checks of a ``pretrain_gpt.py`` launch line (training/arguments.py ``validate_args`` at
d98e8a64ddf3), for lines given as such (``--megatron-args``, a rank file's ``megatron_args``).

These are the launcher's asserts, not Megatron-Core's: Megatron-Bridge and NeMo build Megatron-Core's configs
themselves and do not run them (a Megatron-Bridge recipe sets ``--cross-entropy-fusion-impl te`` with the loss
fusion, which arguments.py refuses), so the published-run rows (``validate``) are not held to them.
Megatron-Core's own rules (TransformerConfig) are checked on the specs, for every input
(config/rules/compatibility.py, the spec classes).
"""

from __future__ import annotations

from echo_tune.errors import ConfigError


def launch_line_problems(present: set[str], model: dict, parallel: dict, base=None) -> list[ConfigError]:
    """What Megatron-LM's arguments.py refuses in a line whose flags are ``present`` and whose settings read
    ``model`` / ``parallel`` (the fields the line sets), laid over the ModelSpec ``base`` if any. A rule
    whose settings the line leaves to other flags (--model, the CLI's own) is not judged here."""
    problems = []

    def refuse(rule: str, got: str, fix: str, where: str) -> None:
        problems.append(ConfigError(f"{rule} (Megatron-LM arguments.py {where} refuses the line), but got ({got}); "
                                    f"{fix}"))

    if model.get("cross_entropy_loss_fusion") and model.get("cross_entropy_fusion_impl") == "te":
        refuse("`--cross-entropy-loss-fusion` cannot use `--cross-entropy-fusion-impl te` (\"disabled due to "
               "stability issues\")", "cross_entropy_fusion_impl='te'",
               "use --cross-entropy-fusion-impl native, or omit --cross-entropy-loss-fusion (Megatron-Bridge "
               "recipes set te through Megatron-Core's config, which has no such check)", "validate_args")
    if parallel.get("tp_comm_overlap") and parallel.get("tensor_model_parallel_size") == 1:
        refuse("`--tp-comm-overlap` needs sequence parallelism, which Megatron-LM turns off at TP 1",
               "tp_comm_overlap=True, tensor_model_parallel_size=1",
               "drop --tp-comm-overlap, or use TP > 1 with --sequence-parallel", "validate_args")
    if model.get("multi_latent_attention") and "--group-query-attention" in present:
        refuse("`--multi-latent-attention` and `--group-query-attention` are mutually exclusive",
               "both given", "drop --group-query-attention", "validate_args")
    position = model.get("position_embedding_type",
                         base.position_embedding_type if base is not None else "learned_absolute")
    if model.get("mtp_num_layers") and position not in ("rope", "none"):
        refuse("multi-token prediction (`--mtp-num-layers`) needs rope or no position embedding",
               f"position_embedding_type={position!r}", "add --position-embedding-type rope", "validate_args")
    if model.get("attention_backend") == "local":
        refuse("`--attention-backend local` runs only with `--spec local`", "attention_backend='local'",
               "use --attention-backend unfused (or flash / fused / auto); --spec is not modelled", "validate_args")
    uneven_vp = [f for f in ("--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
                             "--pipeline-model-parallel-layout") if f in present]
    if len(uneven_vp) > 1:
        refuse("no more than one of --num-layers-per-virtual-pipeline-stage, --num-virtual-stages-per-pipeline-"
               "rank and --pipeline-model-parallel-layout may be set", " ".join(uneven_vp), "keep one",
               "validate_args")
    if parallel.get("cuda_graph_impl") == "full_iteration" and "--no-check-for-nan-in-loss-and-grad" not in present:
        refuse("`--cuda-graph-impl full_iteration` needs `--no-check-for-nan-in-loss-and-grad`",
               "cuda_graph_impl='full_iteration'", "add --no-check-for-nan-in-loss-and-grad", "validate_args")
    if "--no-position-embedding" in present and position != "rope":
        refuse("`--no-position-embedding` is deprecated except with rope", f"position_embedding_type={position!r}",
               "use --position-embedding-type none", "validate_args")
    return problems
