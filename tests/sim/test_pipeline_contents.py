"""A simulated step whose stage contents follow --pipeline-model-parallel-layout, and the interleaved
schedule's micro-batch groups (--microbatch-group-size-per-virtual-pipeline-stage)."""

from pathlib import Path

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.load.loading import load_model
from echo_tune.sim.schedule.layer_mix import chunk_layer_mix
from echo_tune.sim.schedule.schedules import stage_order

TINY = load_model(str(Path(__file__).resolve().parents[1] / "data" / "tiny-llama.yaml")).replace(num_layers=8)
A100 = et.load_cluster("a100-80gb")
GPT3 = et.load_model("gpt3-175b")


def _pp2(layout=None, **kw):
    return et.ParallelConfig(pipeline_model_parallel_size=2, global_batch_size=16,
                             pipeline_model_parallel_layout=layout, **kw)


def test_layout_of_the_even_split_is_the_even_split():
    # "Etttt|ttttL" is what PP2 builds anyway: 4 layers + embedding, 4 layers + loss
    plain = et.simulate(TINY, A100, 2, _pp2())
    spelled = et.simulate(TINY, A100, 2, _pp2("Etttt|ttttL"))
    assert spelled.step_time_s == plain.step_time_s
    assert spelled.stage_memory == plain.stage_memory


def test_heavier_stage_sets_the_step():
    # 2 + 6 layers instead of 4 + 4: the stage with 6 layers runs 1.5x the decoder work per micro-batch of the
    # even split's stages, so over 8 micro-batches of 1F1B the step grows, whichever end holds the 6 layers.
    # Stage 0 finishes last in 1F1B (its last backward follows every other stage's), so it is the critical
    # stage: holding 6 layers it is busy all along (compute up, bubble down); holding 2 it waits on stage 1.
    even = et.simulate(TINY, A100, 2, _pp2())
    heavy_first = et.simulate(TINY, A100, 2, _pp2("Etttttt|ttL"))
    heavy_last = et.simulate(TINY, A100, 2, _pp2("Ett|ttttttL"))
    assert check_compatible(TINY, A100, 2, _pp2("Etttttt|ttL")).stage_layers == (6, 2)
    for report in (heavy_first, heavy_last):
        assert report.step_time_s > even.step_time_s and report.critical_stage == 0
        assert sum(report.breakdown_s.values()) == pytest.approx(report.step_time_s, rel=1e-12)
    assert heavy_first.breakdown_s["compute"] > 1.4 * even.breakdown_s["compute"]
    assert heavy_first.breakdown_s["pp_bubble"] < even.breakdown_s["pp_bubble"]
    assert heavy_last.breakdown_s["compute"] < 0.6 * even.breakdown_s["compute"]
    assert heavy_last.breakdown_s["pp_bubble"] > even.breakdown_s["pp_bubble"]


def test_stage_holding_only_the_embedding():
    # "E|ttttttttL": stage 0 builds no decoder layer, only the word embedding. tiny-llama: vocab 1000 padded
    # to a multiple of 128 -> 1024 rows of hidden 256 = 262,144 parameters (rope: no position table).
    # bf16 weights 2 B each = 524,288 B; fp32 main grads 4 B each = 1,048,576 B; Adam 12 B each.
    report = et.simulate(TINY, A100, 2, _pp2("E|ttttttttL"))
    stage0 = report.stage_memory[0]
    assert stage0.weights_bytes == 2 * 262_144
    assert stage0.gradients_bytes == 4 * 262_144
    assert stage0.optimizer_bytes == 12 * 262_144
    assert report.stage_memory[1].weights_bytes > 8 * stage0.weights_bytes  # 8 layers + output on stage 1
    timeline = et.simulate(TINY, A100, 2, _pp2("E|ttttttttL"), timeline=True).timeline
    assert {0, 1} <= {s for s, *_ in timeline}  # both stages run passes (stage 0: the embedding only)


def test_standalone_mtp_chunk_and_zero_layer_chunks():
    # PP2 VP2 "Et|tt|tm|L": entries Et (stage 0 chunk 0), tt (1, 0), tm (0, 1), L (1, 1). The MTP layer sits in
    # stage 0's last chunk with one decoder layer; stage 1's last chunk holds only the loss.
    model = TINY.replace(num_layers=4, mtp_num_layers=1)
    parallel = et.ParallelConfig(pipeline_model_parallel_size=2, global_batch_size=16,
                                 pipeline_model_parallel_layout="Et|tt|tm|L")
    layout = check_compatible(model, A100, 2, parallel)
    assert layout.stage_chunk_layers == ((1, 1), (2, 0))
    assert chunk_layer_mix(model, layout) == (((1, 0), (2, 0)), ((2, 0), (0, 0)))  # MTP counted as a layer
    report = et.simulate(model, A100, 2, parallel)
    assert sum(report.breakdown_s.values()) == pytest.approx(report.step_time_s, rel=1e-12)


@pytest.mark.parametrize("m, group, forward_mbs, forward_chunks", [
    # ModelParallelConfig.microbatch_group_size_per_vp_stage docstring (model_parallel_config.py, d98e8a64ddf3),
    # PP2 VP2: N=2, M=4 -> rank 0 runs 0 1 0 1 2 3 2 3; N=3, M=5 -> 0 1 2 0 1 2 3 4 3 4
    (4, 2, [0, 1, 0, 1, 2, 3, 2, 3], [0, 0, 1, 1, 0, 0, 1, 1]),
    (5, 3, [0, 1, 2, 0, 1, 2, 3, 4, 3, 4], [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]),
])
def test_microbatch_group_order(m, group, forward_mbs, forward_chunks):
    order = stage_order("interleaved", 0, 2, m, 2, group)
    forwards = [(mb, c) for backward, mb, c in order if not backward]
    assert [mb for mb, _ in forwards] == forward_mbs and [c for _, c in forwards] == forward_chunks
    # warm-up: (p - s - 1) * 2 + (v - 1) * N forwards (get_pp_rank_microbatches), then the steady state runs
    # one forward before each backward
    first_backward = next(i for i, (backward, _, _) in enumerate(order) if backward)
    assert first_backward == 2 + group + 1
    backwards = [(mb, c) for backward, mb, c in order if backward]
    assert backwards[0] == (0, 1)  # backward runs the chunks in reverse


def test_larger_microbatch_groups_hold_more_activations():
    # GPT-3 175B TP8 PP16 VP2 on 1024 A100s, M = 192: stage 0 warms up 2 * 15 + (2 - 1) * N forwards, 46
    # with N = 16 (the default) and 94 with N = 64, so it holds more micro-batches' activations
    base = et.ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, global_batch_size=1536,
                             virtual_pipeline_model_parallel_size=2, recompute_granularity="full")
    default = et.simulate(GPT3, A100, 1024, base)
    same = et.simulate(GPT3, A100, 1024, base.replace(microbatch_group_size_per_vp_stage=16))
    bigger = et.simulate(GPT3, A100, 1024, base.replace(microbatch_group_size_per_vp_stage=64))
    assert same.step_time_s == default.step_time_s and same.peak_memory_bytes == default.peak_memory_bytes
    assert bigger.stage_memory[0].activations_bytes > default.stage_memory[0].activations_bytes


@pytest.mark.parametrize("layout, fp8", [("Ett|tt|tt|ttL", False), ("Et|ttt|ttt|tL", True), (None, True)])
def test_chunks_of_equal_work_are_costed_once_with_the_same_passes(layout, fp8):
    """all_chunk_passes costs chunks that hold the same work once; every (stage, chunk) still gets exactly
    chunk_passes' answer (first/last bf16 layers under FP8 depend on where a chunk starts)."""
    from echo_tune.cost.profile import profile_for
    from echo_tune.sim.schedule.chunk_passes import all_chunk_passes, chunk_passes
    from echo_tune.sim.schedule.costing import CostContext
    from echo_tune.sim.schedule.layer_mix import chunk_window_mix
    from echo_tune.sim.schedule.passes import pass_costs, trace_pieces

    h100 = et.load_cluster("h100")
    parallel = et.ParallelConfig(pipeline_model_parallel_size=4, global_batch_size=16,
                                 pipeline_model_parallel_layout=layout,
                                 virtual_pipeline_model_parallel_size=None if layout else 2,
                                 fp8_format="hybrid" if fp8 else None, first_last_layers_bf16=fp8,
                                 fp8_recipe="tensorwise")
    lay = check_compatible(TINY, h100, 4, parallel)
    pieces = trace_pieces(TINY, parallel, lay)
    ctx = CostContext(profile=profile_for(h100), gpu=h100.gpu, precision=parallel.precision, groups=lay.groups)
    costs = pass_costs(pieces, ctx)
    bf16 = (pass_costs(pieces, ctx), 1, 1) if fp8 else None
    mix, windows = chunk_layer_mix(TINY, lay), chunk_window_mix(TINY, lay)
    got = all_chunk_passes(lay, costs, mix, windows, bf16)
    for s, row in enumerate(got):
        for c, passes in enumerate(row):
            assert passes == chunk_passes(lay, costs, s, c, mix[s][c], bf16, window=windows[s][c])


def test_an_uneven_split_says_which_part_of_the_bubble_is_waiting_on_busier_stages():
    # PP4 with 2 layers on the first stage and 10 on the others: stage 0 ends last (the breakdown is its), yet the
    # busiest stage is another; its pp_bubble is mostly waiting on them, and the note says so
    import echo_tune as et

    model, cluster = et.load_model("llama3.1-8b"), et.load_cluster("h100")
    parallel = et.ParallelConfig(pipeline_model_parallel_size=4, decoder_first_pipeline_num_layers=2,
                                 global_batch_size=32, tensor_model_parallel_size=2)
    report = et.simulate(model, cluster, 8, parallel)
    note = next(n for n in report.notes if "is the busiest" in n)
    assert f"stage {report.critical_stage}'s" in note
    assert "stage 0's" in note and float(note.split("about ")[1].split(" s")[0]) > 0.5 * report.breakdown_s["pp_bubble"]
    # even layers: the output layer and loss (vocabulary 128,256) still make the last stage the busiest
    even = et.simulate(model, cluster, 8, parallel.replace(decoder_first_pipeline_num_layers=None))
    assert any("stage 3 is the busiest" in n for n in even.notes)
    single = et.simulate(model, cluster, 8, parallel.replace(pipeline_model_parallel_size=1,
                                                             decoder_first_pipeline_num_layers=None))
    assert not any("is the busiest" in n for n in single.notes)
