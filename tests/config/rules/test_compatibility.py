"""Every cross-object rule of check_compatible, and the derived Layout."""

import pytest

from echo_tune.config import ParallelConfig, check_compatible, load_cluster, load_model
from echo_tune.errors import ConfigError

GPT3 = load_model("gpt3-175b")
LLAMA = load_model("llama3-70b")
A100 = load_cluster("a100-80gb")


def layout(model=GPT3, num_gpus=1024, **kw):
    kw.setdefault("global_batch_size", 1536)
    return check_compatible(model, A100, num_gpus, ParallelConfig(**kw))


def test_derived_values():
    lay = layout(tensor_model_parallel_size=8, pipeline_model_parallel_size=16)
    assert lay.data_parallel_size == 8
    assert lay.num_micro_batches == 1536 // 8
    assert lay.stage_layers == (6,) * 16
    assert lay.schedule == "1f1b"
    assert lay.groups["tp"].ranks_per_node == 8 and not lay.groups["tp"].crosses_nodes
    assert lay.groups["dp"].num_nodes == 8 and lay.groups["pp"].num_nodes == 16


@pytest.mark.parametrize("kw, fragment", [
    (dict(tensor_model_parallel_size=7, num_gpus=7), "num_attention_heads % tensor_model_parallel_size"),
    (dict(model=LLAMA, tensor_model_parallel_size=16, num_gpus=1024), "above num_query_groups (Megatron replicates"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=5, num_gpus=1004),
     "num_gpus % gpus_per_node"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=3, num_gpus=1024),
     "world size = TP*PP*CP*DP"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=64, num_gpus=1024), "num_layers % pipeline"),
    (dict(tensor_model_parallel_size=8, global_batch_size=1000), "global_batch_size % (micro_batch_size"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, virtual_pipeline_model_parallel_size=4),
     "layers per stage % virtual_pipeline_model_parallel_size"),
    (dict(tensor_model_parallel_size=8, virtual_pipeline_model_parallel_size=2),
     "interleaved schedule needs `pipeline_model_parallel_size > 1`"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, virtual_pipeline_model_parallel_size=2,
          global_batch_size=8 * 24), "num_micro_batches % pipeline_model_parallel_size"),
    (dict(tensor_model_parallel_size=8, recompute_method="uniform"), "apply only to `recompute_granularity == 'full'`"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, recompute_granularity="full",
          recompute_method="block", recompute_num_layers=7), "recompute_num_layers <= layers per model chunk"),
    (dict(tensor_model_parallel_size=8, overlap_param_gather=True), "needs `use_distributed_optimizer`"),
    (dict(tensor_model_parallel_size=8, tp_comm_overlap=True), "`tp_comm_overlap` needs sequence_parallel when"),
    (dict(tensor_model_parallel_size=8, context_parallel_size=3, num_gpus=1536), "seq_length % (2 * context"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, decoder_first_pipeline_num_layers=5),
     "(num_layers - first - last) % remaining stages"),
    (dict(pipeline_model_parallel_size=1, decoder_first_pipeline_num_layers=4, tensor_model_parallel_size=8),
     "uneven pipeline stages need"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, num_layers_per_virtual_pipeline_stage=4),
     "num_layers_per_virtual_pipeline_stage == 0"),
    (dict(model=GPT3.replace(ffn_hidden_size=49150), tensor_model_parallel_size=8),
     "ffn_hidden_size % tensor_model_parallel_size == 0"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, virtual_pipeline_model_parallel_size=3,
          num_layers_per_virtual_pipeline_stage=2), "set only one of virtual_pipeline_model_parallel_size"),
    # uneven stages interleave when every stage's layers divide by VPP (transformer_config.py); here the
    # middle stages hold (96 - 6 - 6) / 6 = 14 layers, not a multiple of 3
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=8, virtual_pipeline_model_parallel_size=3,
          decoder_first_pipeline_num_layers=6, decoder_last_pipeline_num_layers=6),
     "layers per stage % virtual_pipeline_model_parallel_size == 0"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=2, decoder_first_pipeline_num_layers=96),
     "(num_layers - first - last) % remaining stages"),
    (dict(tensor_model_parallel_size=8, sequence_parallel=True, context_parallel_size=2, num_gpus=2048,
          model=GPT3.replace(seq_length=2056)), "seq_length % (tensor_model_parallel_size * context_parallel_size)"),
])
def test_rules(kw, fragment):
    with pytest.raises(ConfigError) as err:
        layout(**kw)
    message = str(err.value)
    assert fragment in message
    assert "\n" not in message


def test_uneven_stages_and_interleaving():
    lay = layout(tensor_model_parallel_size=8, pipeline_model_parallel_size=8,
                 decoder_first_pipeline_num_layers=6, decoder_last_pipeline_num_layers=6)
    assert lay.stage_layers == (6,) + (14,) * 6 + (6,)
    lay = layout(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, num_layers_per_virtual_pipeline_stage=2)
    assert lay.virtual_pipeline_size == 3 and lay.schedule == "interleaved"
    assert lay.stage_chunk_layers[0] == (2, 2, 2)


def test_recompute_defaults_follow_megatron_2021():
    lay = layout(tensor_model_parallel_size=8, recompute_granularity="full")
    assert (lay.recompute_method, lay.recompute_num_layers) == ("uniform", 1)


def test_sequence_parallel_is_off_at_tp1():
    assert not layout(num_gpus=512, global_batch_size=512, sequence_parallel=True).sequence_parallel


def test_group_placement_follows_megatron_rank_order():
    lay = layout(model=GPT3.replace(use_flash_attn=True), tensor_model_parallel_size=2, context_parallel_size=2,
                 pipeline_model_parallel_size=8, num_gpus=1024)
    # TP innermost (2 per node), CP next (stride 2: 2 per node), DP stride 4: 2 per node, PP across nodes
    assert lay.groups["tp"].ranks_per_node == 2
    assert lay.groups["cp"].ranks_per_node == 2
    assert lay.groups["dp"].ranks_per_node == 2 and lay.groups["dp"].num_nodes == 16
    assert lay.groups["pp"].ranks_per_node == 1


def test_spec_validation_messages():
    with pytest.raises(ConfigError, match=r"`tensor_model_parallel_size > 0` must hold, but got"):
        ParallelConfig(global_batch_size=8, tensor_model_parallel_size=0)
    with pytest.raises(ConfigError, match="recompute_granularity"):
        ParallelConfig(global_batch_size=8, recompute_granularity="partial")
    with pytest.raises(ConfigError, match="num_attention_heads % num_query_groups"):
        GPT3.replace(num_query_groups=5)


def test_tp_comm_overlap_is_a_no_op_at_tp1():
    lay = layout(num_gpus=512, global_batch_size=512, tp_comm_overlap=True)
    assert lay.groups["tp"].size == 1


def test_embedding_and_loss_count_in_the_pipeline_split():
    # Megatron core/transformer/transformer_block.py: (num_layers + extra) / PP per stage, one fewer at the ends
    both = layout(model=LLAMA, num_gpus=384, tensor_model_parallel_size=8, pipeline_model_parallel_size=2,
                  global_batch_size=384, account_for_embedding_in_pipeline_split=True,
                  account_for_loss_in_pipeline_split=True)
    assert both.stage_layers == (40, 40)
    first = layout(model=LLAMA, num_gpus=384, tensor_model_parallel_size=8, pipeline_model_parallel_size=3,
                   global_batch_size=384, account_for_embedding_in_pipeline_split=True)
    assert first.stage_layers == (26, 27, 27) and sum(first.stage_layers) == LLAMA.num_layers
    with pytest.raises(ConfigError, match=r"\(num_layers \+ 1\) % pipeline_model_parallel_size == 0"):
        layout(model=LLAMA, num_gpus=512, tensor_model_parallel_size=8, pipeline_model_parallel_size=8,
               global_batch_size=512, account_for_embedding_in_pipeline_split=True)


def test_tp_pp_dp_mapping_moves_dp_outside_the_pipeline():
    # 1024 A100s (8 per node), TP8 PP16 DP8, 16 nodes per leaf switch. Default order tp-cp-dp-pp: DP ranks
    # 8 apart span 8 * 7 / 8 + 1 = 8 nodes (1 leaf), PP ranks 64 apart span 64 * 15 / 8 + 1 = 121 nodes
    # (8 leaves). With --use-tp-pp-dp-mapping (tp-cp-pp-dp): PP ranks 8 apart span 16 nodes (1 leaf), DP ranks
    # 8 * 16 = 128 apart span 128 * 7 / 8 + 1 = 113 nodes (8 leaves).
    cluster = A100.replace(nodes_per_leaf=16)
    base = ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, global_batch_size=1536)
    default = check_compatible(GPT3, cluster, 1024, base).groups
    mapped = check_compatible(GPT3, cluster, 1024, base.replace(use_tp_pp_dp_mapping=True)).groups
    assert (default["dp"].num_leaves, default["pp"].num_leaves) == (1, 8)
    assert (mapped["dp"].num_leaves, mapped["pp"].num_leaves) == (8, 1)
    assert mapped["dp"].num_nodes == 8 and mapped["pp"].num_nodes == 16 and default["tp"] == mapped["tp"]


def test_tp_pp_dp_mapping_needs_matching_expert_pipeline_groups():
    # parallel_state.py asserts both rank generators give the same PP groups: ETP x EP == TP x CP
    mixtral = load_model("mixtral-8x7b")
    base = ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=4, global_batch_size=512,
                          sequence_parallel=True, use_tp_pp_dp_mapping=True)
    check_compatible(mixtral, A100, 64, base.replace(expert_model_parallel_size=2, expert_tensor_parallel_size=1))
    with pytest.raises(ConfigError, match="use_tp_pp_dp_mapping"):
        check_compatible(mixtral, A100, 64, base.replace(expert_model_parallel_size=4))


def test_microbatch_group_size_rules():
    # schedules.py: PP <= N <= M, and M % N == 0 or >= PP. TP8 PP16 VP2 on 1024 GPUs: DP 8, M = 1536 / 8 = 192
    base = ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, global_batch_size=1536,
                          virtual_pipeline_model_parallel_size=2)
    check_compatible(GPT3, A100, 1024, base.replace(microbatch_group_size_per_vp_stage=32))  # 192 % 32 == 0
    check_compatible(GPT3, A100, 1024, base.replace(microbatch_group_size_per_vp_stage=44))  # 192 % 44 = 16 >= 16
    with pytest.raises(ConfigError, match="pipeline_model_parallel_size <= microbatch_group_size_per_vp_stage"):
        check_compatible(GPT3, A100, 1024, base.replace(microbatch_group_size_per_vp_stage=8))
    with pytest.raises(ConfigError, match="must be 0 or at least"):  # 192 % 59 = 15 < 16
        check_compatible(GPT3, A100, 1024, base.replace(microbatch_group_size_per_vp_stage=59))
    with pytest.raises(ConfigError, match="applies to the interleaved schedule only"):
        check_compatible(GPT3, A100, 1024, base.replace(virtual_pipeline_model_parallel_size=None,
                                                        microbatch_group_size_per_vp_stage=16))


def test_overlap_p2p_warmup_flush_needs_the_interleaved_schedule():
    # model_parallel_config.py: only with overlap_p2p_comm, which validate_args turns off without VPP
    base = ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, global_batch_size=1536,
                          virtual_pipeline_model_parallel_size=2, overlap_p2p_comm_warmup_flush=True)
    check_compatible(GPT3, A100, 1024, base)
    with pytest.raises(ConfigError, match="needs the interleaved schedule"):
        check_compatible(GPT3, A100, 1024, base.replace(virtual_pipeline_model_parallel_size=None))


def test_context_parallelism_needs_a_flash_style_attention_backend():
    # TransformerEngine disables its unfused attention under CP; Megatron's local attention asserts CP 1
    for model in (GPT3, LLAMA.replace(attention_backend="unfused"), LLAMA.replace(attention_backend="local")):
        with pytest.raises(ConfigError, match=r"`context_parallel_size > 1` needs a flash-style attention backend.*"
                                              r"--attention-backend flash"):
            layout(model=model, context_parallel_size=2, tensor_model_parallel_size=8, num_gpus=1024)
    assert layout(model=LLAMA, context_parallel_size=2, tensor_model_parallel_size=8, num_gpus=1024)


def test_a_global_batch_in_tokens_is_refused_with_its_size_in_sequences():
    import echo_tune as et
    from echo_tune.config.rules.compatibility import MAX_TOKENS_PER_STEP, check_compatible

    model = et.load_model("llama3-8b")  # 8,192-token sequences
    with pytest.raises(ConfigError, match=r"counts sequences, not tokens; a batch of 4,194,304 tokens is 512 sequences"):
        check_compatible(model, et.load_cluster("h100-sxm"), 8, et.ParallelConfig(global_batch_size=4_194_304))
    with pytest.raises(ConfigError, match=r"a batch of 1,048,576 tokens is 128 sequences"):  # 8.6G tokens per step
        check_compatible(model, et.load_cluster("h100-sxm"), 8, et.ParallelConfig(global_batch_size=2**20))
    assert 16 * 2**20 * 128 == MAX_TOKENS_PER_STEP  # Llama 3's 16M-token batch, x128
    check_compatible(model, et.load_cluster("h100-sxm"), 8, et.ParallelConfig(global_batch_size=2048))
