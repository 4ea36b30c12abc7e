"""sim/data_parallel/muon_shards.py: which whole tensors each data-parallel rank keeps states for under Muon's layer-wise
distributed optimizer, by hand on Megatron-LM's functional-test MoE model (12 layers, hidden 512, 8 experts)."""

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.specs.model import ModelSpec
from echo_tune.sim.data_parallel.muon_shards import ping_pong

LINE = ("--num-layers 12 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --disable-bias-linear "
        "--num-experts 8 --moe-ffn-hidden-size 1024 --moe-router-topk 2 --moe-grouped-gemm --vocab-size 50257 "
        "--micro-batch-size 4 --global-batch-size 32 --bf16 --optimizer muon")
MODEL_FIELDS, PARALLEL_FIELDS, _, _ = parse_megatron_line(LINE)
MODEL = ModelSpec(name="functional-moe", **MODEL_FIELDS)
H100 = et.load_cluster("h100-sxm")
WORD = 50304 * 512  # vocabulary padded to a multiple of 128; Adam: master + exp_avg + exp_avg_sq, 12 bytes
NORM, ROUTER, PROJ, QKV, POSITION = 512, 8 * 512, 512 * 512, 1536 * 512, 1024 * 512
EXPERT_MATRIX = 1024 * 512  # one local expert's fc1 or fc2 (GeLU), Muon: master + momentum, 8 bytes


def _stage(num_gpus, ep, **changes):
    parallel = et.ParallelConfig(**PARALLEL_FIELDS, expert_model_parallel_size=ep, **changes)
    report = et.simulate(MODEL, H100, num_gpus, parallel)
    return report, report.stage_memory[-1]


def test_ping_pong_deals_by_size_as_megatron_documents():
    # layer_wise_optimizer.py _shard_params_ping_pong: 4 ranks, p0-p9 sorted -> [[p0, p7, p8], [p1, p6, p9], ...]
    assert ping_pong(list(range(10)), 4) == [[0, 7, 8], [1, 6, 9], [2, 5], [3, 4]]
    # sorted by size first: 1 (index 1) to rank 0, 3 (index 2) to rank 1, 5 (index 0) to rank 1 (turns 0, 1, 1, 0)
    assert ping_pong([5, 1, 3], 2) == [[1], [2, 0]]


def test_functional_model_tensors_sum_to_the_stage_parameters():
    from echo_tune.sim.schedule.passes import trace_pieces
    from echo_tune.config.rules.compatibility import check_compatible
    parallel = et.ParallelConfig(**PARALLEL_FIELDS, expert_model_parallel_size=8)
    pieces = trace_pieces(MODEL, parallel, check_compatible(MODEL, H100, 8, parallel))
    layer = pieces["moe_layer"].param_tensors  # qkv norm w+b, qkv, proj, pre-MLP norm w+b, router, 2 experts
    assert sorted(layer) == sorted([(NORM, "other")] * 4 + [(QKV, "matrix"), (PROJ, "matrix"), (ROUTER, "matrix"),
                                                             (EXPERT_MATRIX, "expert"), (EXPERT_MATRIX, "expert")])
    assert pieces["embedding"].param_tensors == ((WORD, "other"), (POSITION, "matrix"))  # position: Muon's
    assert sorted(pieces["output"].param_tensors) == [(NORM, "other"), (NORM, "other"), (WORD, "tied")]
    _, stage = _stage(8, 8)
    dense = 12 * (4 * NORM + QKV + PROJ + ROUTER) + WORD + POSITION + 2 * NORM  # tied output counted once
    assert stage.weights_bytes == 2 * (dense + 12 * 2 * EXPERT_MATRIX)


def test_last_of_eight_ranks_gets_the_word_embeddings():
    # 88 dense tensors sorted by size: 50 norms (512), 12 routers, 12 projections, the position embeddings,
    # 12 QKV, the word embeddings (turn 87). Rank 7 takes turns 7 and 8 of every 16: norms at 7, 8, 23, 24, 39,
    # 40; routers at 55, 56; projections at 71, 72; and turn 87, the word embeddings. Expert DP is 1 (EP 8):
    # every rank keeps its own expert's 24 matrices.
    _, stage = _stage(8, 8, use_distributed_optimizer=True, use_layer_wise_param_layout=False)
    last = 12 * (WORD + 6 * NORM) + 8 * (2 * ROUTER + 2 * PROJ) + 8 * 24 * EXPERT_MATRIX
    assert stage.optimizer_bytes == last == 414_027_776
    assert stage.dp_spread_bytes == 0  # no rank holds more than the one with the embeddings
    _, whole = _stage(8, 8)  # without the distributed optimizer every rank updates all 88 + 24 tensors
    dense_states = 12 * (50 * NORM + WORD) + 8 * (12 * (ROUTER + PROJ + QKV) + POSITION)
    assert whole.optimizer_bytes == dense_states + 8 * 24 * EXPERT_MATRIX
    assert whole.optimizer_bytes - stage.optimizer_bytes == 101_261_312  # Megatron's goldens: 102.7 MB (H100)


def test_on_four_ranks_the_embeddings_land_on_rank_zero_and_the_fit_check_takes_it():
    # DP 4 (EP 4, two local experts): turns run 0,1,2,3,3,2,1,0; turn 87 is rank 0's. The last rank, 3, takes
    # turns 3, 4 of every 8: 12 norms, routers 51, 52, 59, 60, projections 67, 68, QKV 75, 76, 83, 84.
    report, stage = _stage(4, 4, use_distributed_optimizer=True, use_layer_wise_param_layout=False)
    experts = 8 * 2 * 24 * EXPERT_MATRIX
    last = 12 * 12 * NORM + 8 * (4 * ROUTER + 2 * PROJ + 4 * QKV) + experts
    assert stage.optimizer_bytes == last == 230_891_520
    # rank 0: turns 0, 7 of every 8: 13 norms, routers 55, 56, projections 63, 64, 71, 72, QKV 79, 80, embeddings
    first = 12 * (13 * NORM + WORD) + 8 * (2 * ROUTER + 4 * PROJ + 2 * QKV) + experts
    assert stage.dp_spread_bytes == first - last == 300_619_776
    assert report.peak_memory_bytes == stage.worst_rank_bytes == stage.total_bytes + stage.dp_spread_bytes


def test_with_the_param_layout_each_rank_keeps_a_dp_share():
    _, whole = _stage(4, 4)
    _, layout = _stage(4, 4, use_distributed_optimizer=True)  # default layer-wise param layout: 1/DP each
    experts = 8 * 2 * 24 * EXPERT_MATRIX  # expert DP 1: kept whole
    assert layout.optimizer_bytes == pytest.approx((whole.optimizer_bytes - experts) / 4 + experts, abs=1)
    assert layout.dp_spread_bytes == 0


def test_the_report_notes_the_spread():
    report, _ = _stage(4, 4, use_distributed_optimizer=True, use_layer_wise_param_layout=False)
    assert any("0.28 GiB more optimizer state" in note for note in report.notes)  # 300_619_776 bytes
    report, _ = _stage(4, 4, use_distributed_optimizer=True)
    assert not any("deals whole tensors" in note for note in report.notes)
