"""Reading real Megatron-LM launch lines as Megatron reads them (defaults of d98e8a64ddf3, legacy flags)."""

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
from echo_tune.config.launch.tokenizers import tokenizer_vocab_size
from echo_tune.errors import ConfigError

# examples/llama/train_llama3_8b_h100_fp8.sh at d98e8a64ddf3, real-data branch (a tokenizer, no --vocab-size)
LLAMA3_8B_FP8 = (
    "pretrain_gpt.py --use-mcore-models --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 "
    "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --kv-channels 128 --seq-length 8192 "
    "--max-position-embeddings 8192 --position-embedding-type rope --attention-dropout 0.0 --hidden-dropout 0.0 "
    "--swiglu --normalization RMSNorm --attention-backend fused --untie-embeddings-and-output-weights "
    "--disable-bias-linear --micro-batch-size 1 --global-batch-size 128 --bf16 --grad-reduce-in-bf16 "
    "--fp8-format hybrid --fp8-amax-history-len 1024 --fp8-param-gather --tensor-model-parallel-size 1 "
    "--context-parallel-size 1 --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce "
    "--overlap-param-gather --data-path /data/x --tokenizer-type HuggingFaceTokenizer "
    "--tokenizer-model meta-llama/Meta-Llama-3-8B")
# a 2021-style GPT line: BPE vocab/merges files, --checkpoint-activations-era recompute flags
GPT_2021 = ("pretrain_gpt.py --num-layers 80 --hidden-size 12288 --num-attention-heads 96 --seq-length 2048 "
            "--max-position-embeddings 2048 --micro-batch-size 1 --global-batch-size 1536 "
            "--tensor-model-parallel-size 8 --pipeline-model-parallel-size 8 --vocab-file gpt2-vocab.json "
            "--merge-file gpt2-merges.txt --activations-checkpoint-method uniform --fp16")


def _specs(line):
    model, parallel, precision, ignored = parse_megatron_line(line)
    return (et.ModelSpec(name="line", **model), et.ParallelConfig(precision=precision, **parallel), ignored)


def test_llama3_fp8_script_with_a_tokenizer_simulates():
    model, parallel, _ = _specs(LLAMA3_8B_FP8)
    assert model.vocab_size == 128256 and model.query_groups == 8 and model.attention_backend == "fused"
    assert parallel.fp8_format == "hybrid" and parallel.fp8_param_gather and parallel.grad_reduce_in_bf16
    report = et.simulate(model, et.load_cluster("h100"), 8, parallel)
    assert report.fits_memory and report.step_time_s > 0


def test_2021_checkpoint_method_means_full_recompute():
    model, parallel, _ = _specs(GPT_2021)
    assert model.vocab_size == 50257  # --merge-file: GPT2BPETokenizer
    assert parallel.recompute_granularity == "full" and parallel.recompute_method == "uniform"
    a100 = et.load_cluster("a100-80gb")
    full = et.simulate(model, a100, 1024, parallel).peak_memory_bytes
    none = et.simulate(model, a100, 1024, parallel.replace(recompute_granularity=None, recompute_method=None))
    assert full < 0.75 * none.peak_memory_bytes


def test_recompute_activations_is_selective_and_modules_are_checked():
    _, parallel, _ = _specs(GPT_2021.replace("--activations-checkpoint-method uniform", "--recompute-activations"))
    assert parallel.recompute_granularity == "selective"
    _, parallel, _ = _specs(GPT_2021 + " --recompute-modules core_attn mlp")
    assert parallel.recompute_modules == ("core_attn", "mlp")
    with pytest.raises(ConfigError, match="'mhc' is not modelled"):
        _specs(GPT_2021 + " --recompute-granularity selective --recompute-modules core_attn mhc")


def test_query_groups_need_group_query_attention():
    model, _, ignored = _specs(LLAMA3_8B_FP8.replace("--group-query-attention ", ""))
    assert model.query_groups == 32 and any("--num-query-groups" in f for f in ignored)


def test_swiglu_ffn_default_and_attention_backend_default():
    model, _, _ = _specs(GPT_2021 + " --swiglu")
    assert model.ffn_size == int(4 * 12288 * 2 / 3 / 64) * 64 == 32768
    assert model.attention_backend == "auto" and model.flash_attention
    legacy = et.ModelSpec(num_layers=1, hidden_size=64, num_attention_heads=1, seq_length=8, vocab_size=8,
                          use_flash_attn=False)
    assert not legacy.flash_attention
    flags = to_megatron_flags({"use_flash_attn": False, "attention_backend": "auto"}, {}, "bf16")
    assert flags[flags.index("--attention-backend") + 1] == "unfused" and "--use-flash-attn" not in flags


def test_unknown_tokenizer_asks_for_vocab_size():
    assert tokenizer_vocab_size("TikTokenizer", None) == 131072
    assert tokenizer_vocab_size("HuggingFaceTokenizer", "/models/Qwen2.5-7B") == 151665
    with pytest.raises(ConfigError, match="add --vocab-size N"):
        tokenizer_vocab_size("HuggingFaceTokenizer", "deepseek-ai/DeepSeek-V3")


def test_deprecated_rotary_flag_means_rope_as_in_megatron():
    # arguments.py validate_args at d98e8a64ddf3: `if args.use_rotary_position_embeddings:
    # args.position_embedding_type = 'rope'`, whatever --position-embedding-type says
    model, _, _, _ = parse_megatron_line("--position-embedding-type learned_absolute --use-rotary-position-embeddings")
    assert model["position_embedding_type"] == "rope"


# Megatron-Bridge's DeepSeek-V3 H100 recipe (runs_bridge.csv) pipeline settings, as a launch line
DSV3_PIPELINE = ("--pipeline-model-parallel-size 8 --pipeline-model-parallel-layout Et|(tt|)*30mL "
                 "--microbatch-group-size-per-virtual-pipeline-stage 16 --use-tp-pp-dp-mapping")


def test_pipeline_layout_flags_read_and_write_back():
    _, parallel, _, ignored = parse_megatron_line(DSV3_PIPELINE + " --global-batch-size 8192")
    assert parallel["pipeline_model_parallel_layout"] == "Et|(tt|)*30mL" and not ignored
    assert parallel["microbatch_group_size_per_vp_stage"] == 16 and parallel["use_tp_pp_dp_mapping"] is True
    # Bridge's spelling with / reads the same
    _, slashed, _, _ = parse_megatron_line("--pipeline-model-parallel-layout Et/(tt/)*30mL")
    assert et.ParallelConfig(global_batch_size=1, **slashed).pipeline_model_parallel_layout == "Et|(tt|)*30mL"
    # written back quoted for the shell, and without a VPP flag (the layout sets VPP; arguments.py refuses both)
    flags = to_megatron_flags({}, {**parallel, "virtual_pipeline_model_parallel_size": 4}, "bf16")
    line = " ".join(flags)
    assert "--pipeline-model-parallel-layout 'Et|(tt|)*30mL'" in line
    assert "--num-virtual-stages-per-pipeline-rank" not in line
    assert "--use-tp-pp-dp-mapping" in flags
    _, again, _, _ = parse_megatron_line(line)
    assert again["pipeline_model_parallel_layout"] == "Et|(tt|)*30mL"


def test_full_recompute_flags_state_method_and_layers():
    # Megatron-Core's TransformerConfig refuses full recompute without both; the simulation's defaults are written
    flags = to_megatron_flags({}, {"recompute_granularity": "full"}, "bf16")
    assert flags[flags.index("--recompute-method") + 1] == "uniform"
    assert flags[flags.index("--recompute-num-layers") + 1] == "1"
    block = to_megatron_flags({}, {"recompute_granularity": "full", "recompute_method": "block",
                                   "recompute_num_layers": 4}, "bf16")
    assert block[block.index("--recompute-method") + 1] == "block" and "4" in block
    assert "--recompute-method" not in to_megatron_flags({}, {"recompute_granularity": "selective"}, "bf16")


def test_simulate_notes_what_a_launch_line_must_add_or_cannot_say():
    model, cluster = et.load_model("llama3.1-8b"), et.load_cluster("h100")
    parallel = et.ParallelConfig(tensor_model_parallel_size=4, global_batch_size=16, recompute_granularity="full",
                                 use_distributed_optimizer=True, overlap_param_gather=True)
    notes = " | ".join(et.simulate(model, cluster, 8, parallel).notes)
    assert "simulated as uniform, 1 layer(s)" in notes and "Must use --overlap-param-gather" in notes
    clean = parallel.replace(recompute_method="block", recompute_num_layers=2, overlap_grad_reduce=True)
    notes = " | ".join(et.simulate(model, cluster, 8, clean).notes)
    assert "simulated as" not in notes and "overlap-param-gather" not in notes
