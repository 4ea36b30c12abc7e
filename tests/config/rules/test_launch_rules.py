"""Megatron-LM's reading of a launch line where echo-tune read it otherwise (each case cites arguments.py,
transformer_config.py or build_tokenizer.py at d98e8a64ddf3)."""

import json

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.errors import ConfigError

LINE = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
        "--max-position-embeddings 2048 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 16 --bf16")


def test_recompute_activations_is_selective_whatever_granularity_is_given():
    _, parallel, _, _ = parse_megatron_line(LINE + " --recompute-activations --recompute-granularity full")
    assert parallel["recompute_granularity"] == "selective"  # arguments.py: args.recompute_granularity = 'selective'


def test_the_modern_recompute_count_is_kept_for_the_rules_to_judge():
    _, parallel, _, _ = parse_megatron_line(LINE + " --recompute-granularity selective --recompute-num-layers 4")
    assert parallel["recompute_num_layers"] == 4  # TransformerConfig raises: not dropped without a word
    with pytest.raises(ConfigError, match="apply only to `recompute_granularity == 'full'`"):
        et.check_compatible(et.ModelSpec(name="m", num_layers=4, hidden_size=1024, num_attention_heads=16,
                                         seq_length=2048, vocab_size=32000), et.load_cluster("h100"), 8,
                            et.ParallelConfig(**parallel))


def test_the_tokenizer_sets_the_vocabulary_unless_megatron_reads_vocab_size_for_it():
    model, _, _, ignored = parse_megatron_line(LINE + " --tokenizer-type GPT2BPETokenizer")
    assert model["vocab_size"] == 50257 and any("--vocab-size 32000" in i for i in ignored)
    model, _, _, _ = parse_megatron_line(LINE + " --tokenizer-type NullTokenizer")
    assert model["vocab_size"] == 32000
    model, _, _, _ = parse_megatron_line(LINE + " --tokenizer-type HuggingFaceTokenizer --tokenizer-model acme/x")
    assert model["vocab_size"] == 32000  # a tokenizer echo-tune cannot size: --vocab-size stands for it


def test_use_flash_attn_beside_an_attention_backend_does_not_decide():
    model, _, _, ignored = parse_megatron_line(LINE + " --use-flash-attn --attention-backend unfused")
    spec = et.ModelSpec(name="m", **model)
    assert not spec.flash_attention and any("--use-flash-attn" in i for i in ignored)


def test_yarn_runs_the_unfused_rope():
    model, _, _, _ = parse_megatron_line(LINE + " --position-embedding-type yarn")
    assert not et.ModelSpec(name="m", **model).rope_fused
    assert et.ModelSpec(name="m", **{**model, "position_embedding_type": "rope"}).rope_fused


def test_megatron_normalises_zero_experts_and_a_negative_capacity():
    model, _, _, _ = parse_megatron_line(LINE + " --num-experts 0")
    assert model["num_experts"] is None
    model, _, _, _ = parse_megatron_line(LINE + " --num-experts 8 --moe-expert-capacity-factor -1")
    assert model["moe_expert_capacity_factor"] is None


def test_several_load_balancing_types_are_read_and_sinkhorn_refuses_a_capacity():
    model, _, _, _ = parse_megatron_line(LINE + " --num-experts 8 --moe-router-load-balancing-type seq_aux_loss "
                                                "global_aux_loss")
    assert et.ModelSpec(name="m", **model).moe_router_load_balancing_type == "seq_aux_loss global_aux_loss"
    with pytest.raises(ConfigError, match="works only with aux_loss"):
        et.ModelSpec(name="m", **{**model, "moe_router_load_balancing_type": "sinkhorn",
                                  "moe_expert_capacity_factor": 1.0})


@pytest.mark.parametrize("extra, fragment", [
    ("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", "cross-entropy-fusion-impl native"),
    ("--tensor-model-parallel-size 1 --tp-comm-overlap", "turns off at TP 1"),
    ("--multi-latent-attention --group-query-attention --num-query-groups 8", "mutually exclusive"),
    ("--mtp-num-layers 1", "needs rope or no position embedding"),
    ("--attention-backend local", "--spec local"),
    ("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 "
     "--num-layers-per-virtual-pipeline-stage 1", "no more than one of"),
    ("--cuda-graph-impl full_iteration", "--no-check-for-nan-in-loss-and-grad"),
    ("--no-position-embedding", "deprecated except with rope"),
])
def test_megatron_lm_launch_lines_are_held_to_its_argument_checks(extra, fragment):
    parse_megatron_line(LINE + " " + extra)  # not a Megatron-LM line (a recipe's settings): read
    with pytest.raises(ConfigError, match=fragment.replace("(", r"\(")):
        parse_megatron_line(LINE + " " + extra, megatron_lm=True)


def test_a_launch_line_megatron_accepts_passes_its_checks():
    parse_megatron_line(LINE + " --position-embedding-type rope --mtp-num-layers 1 --cuda-graph-impl full_iteration "
                        "--no-check-for-nan-in-loss-and-grad", megatron_lm=True)


def test_a_recompute_count_without_recompute_is_ignored_as_megatron_ignores_it(capsys):
    # TransformerConfig checks recompute_method / recompute_num_layers only with a granularity set: judged on the
    # settings in effect, so a granularity given as echo-tune's own flag keeps the line's method and count
    from echo_tune.cli.main import main

    base = ["simulate", "--cluster", "h100", "--num-gpus", "8", "--json", "--megatron-args",
            LINE + " --recompute-num-layers 2 --recompute-method block"]
    assert main(base) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["config"]["recompute_num_layers"] is None and any("--recompute-num-layers" in n for n in data["notes"])
    assert main(base + ["--recompute-granularity", "full"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["config"]["recompute_method"], data["config"]["recompute_num_layers"]) == ("block", 2)


def test_launch_flags_leave_out_tp_comm_overlap_at_tp_1():
    from echo_tune.config.launch.megatron_args import to_megatron_flags

    model = dict(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=128, vocab_size=100)
    flags = to_megatron_flags(model, dict(tensor_model_parallel_size=1, tp_comm_overlap=True, global_batch_size=8),
                              "bf16")
    assert "--tp-comm-overlap" not in flags
    parse_megatron_line(" ".join(flags), megatron_lm=True)  # Megatron-LM would take the line
    flags = to_megatron_flags(model, dict(tensor_model_parallel_size=2, sequence_parallel=True, tp_comm_overlap=True,
                                          global_batch_size=8), "bf16")
    assert "--tp-comm-overlap" in flags


@pytest.mark.parametrize("setting, flag", [({"scatter_gather_tensors_in_pipeline": True},
                                            "--scatter-gather-tensors-in-pipeline"),
                                           ({"async_tensor_model_parallel_allreduce": False},
                                            "--no-async-tensor-model-parallel-allreduce")])
def test_a_legacy_flag_in_the_launch_line_is_named_as_one(setting, flag):
    """megatron_args.txt and simulate's notes say which flags only older Megatron-LM code had."""
    from echo_tune.config.launch.launch_notes import launch_notes

    notes = [n for n in launch_notes(setting) if n.startswith(flag)]
    assert len(notes) == 1 and "d98e8a64ddf3 does not accept it" in notes[0]
    assert not [n for n in launch_notes({}) if "older Megatron-LM" in n]
    report = et.simulate(et.load_model("gpt3-175b"), et.load_cluster("a100-80gb"), 1024,
                         et.ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=16,
                                           global_batch_size=1536, **setting))
    assert any(n.startswith(flag) for n in report.notes)
