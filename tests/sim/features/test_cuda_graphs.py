"""CUDA graphs: captured kernels run closer together and the host issues none of them, the graphs' static buffers,
Megatron's rules."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
from echo_tune.config.rules.schedule_rules import cuda_graph_setting
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.costing import CostContext, phase_cost
from echo_tune.sim.features.cuda_graphs import ATTN_REGIONS, capture_spec
from echo_tune.workload.tracer import trace_layer

TINY = et.load_model("tests/data/tiny-llama.yaml")  # 4 layers, h 256, seq 256, vocab 1000
LLAMA8 = et.load_model("llama3-8b")
H100 = et.load_cluster("h100-sxm")
BASE = et.ParallelConfig(global_batch_size=8)


def _costs(parallel):
    profile = profile_for(H100)
    layout = check_compatible(TINY, H100, 1, parallel)
    ctx = CostContext(profile=profile, gpu=H100.gpu, precision="bf16", groups=layout.groups,
                      graph_capture=capture_spec(cuda_graph_setting(parallel)))
    return ctx, profile


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.usefixtures("gpu_time_only")  # GPU time of a tiny model (tests/conftest.py)
def test_captured_kernels_save_the_gap_not_their_gpu_time(direction):
    # A replayed kernel saves 0.4 us of its 4 us per-kernel GPU time (NVIDIA's CUDA Graphs blog: 3.8 -> 3.4 us per
    # kernel): N captured kernels, N x 0.4 us, however many graphs hold them (a graph's launch is the host's).
    trace = trace_layer(TINY, tensor_model_parallel_size=1, context_parallel_size=1, sequence_parallel=False,
                        micro_batch_size=1, precision="bf16")
    ops = getattr(trace, direction)
    kernels = [op for op in ops if op.kind != "collective"]
    attn = [op for op in kernels if op.region in ATTN_REGIONS]
    assert len(kernels) > len(attn) > 1
    eager_ctx, profile = _costs(BASE)
    assert profile.kernel_launch_overhead_s == pytest.approx(4e-6)
    eager = phase_cost(ops, eager_ctx, piece="layer").compute_s
    # whole layer in one graph
    whole = phase_cost(ops, _costs(BASE.replace(cuda_graph_impl="local"))[0], piece="layer").compute_s
    assert eager - whole == pytest.approx(len(kernels) * 0.4e-6, rel=1e-9)
    # only attention captured: its kernels as one graph
    attn_only = BASE.replace(cuda_graph_impl="transformer_engine", cuda_graph_modules=("attn",))
    partial = phase_cost(ops, _costs(attn_only)[0], piece="layer").compute_s
    assert eager - partial == pytest.approx(len(attn) * 0.4e-6, rel=1e-9)
    # full iteration: one graph for the whole step, no launch per pass; the output piece is captured too
    full = BASE.replace(cuda_graph_impl="full_iteration")
    assert eager - phase_cost(ops, _costs(full)[0], piece="layer").compute_s == \
        pytest.approx(len(kernels) * 0.4e-6, rel=1e-9)
    # per-layer graphs leave the embedding and output pieces eager
    assert phase_cost(ops, _costs(BASE.replace(cuda_graph_impl="local"))[0], piece="output").compute_s == eager


def test_static_buffers_by_hand():
    # TINY, TP1, mbs 1, one stage: a layer's input is [256 tokens, 1, 256 hidden] bf16 = 131072 bytes, and one
    # micro-batch is in flight. TE whole-layer graphs: per layer a static input and output (2 x 131072) and
    # the [1, 1, 256, 256] bool attention mask (65536) -> 4 layers x 327680 = 1310720 bytes.
    def graph_bytes(**kw):
        return et.simulate(TINY, H100, 1, BASE.replace(**kw)).stage_memory[0].cuda_graph_bytes
    assert graph_bytes() == 0
    assert graph_bytes(cuda_graph_impl="transformer_engine") == 4 * (2 * 131072 + 256 * 256)
    # local whole-layer graphs chain their buffers: one boundary copy per chunk
    assert graph_bytes(cuda_graph_impl="local") == 131072
    # local attn + mlp graphs: an input and an output copy per graph, 2 graphs per layer
    assert graph_bytes(cuda_graph_impl="local", cuda_graph_modules=("attn", "mlp")) == 4 * 2 * 2 * 131072
    # full iteration: 8 micro-batches of 256 tokens, 28 bytes of static batch per token
    assert graph_bytes(cuda_graph_impl="full_iteration") == 8 * 256 * 28


def test_two_stages_keep_buffers_per_micro_batch_in_flight():
    # PP2, 1F1B: stage 0 holds 2 micro-batches in flight (warm-up p - s - 1 = 1, plus the steady one) of its
    # 2 layers; TE whole-layer graphs -> 2 x 2 x 327680
    parallel = BASE.replace(pipeline_model_parallel_size=2, cuda_graph_impl="transformer_engine")
    report = et.simulate(TINY, H100, 2, parallel)
    assert report.stage_memory[0].cuda_graph_bytes == 2 * 2 * (2 * 131072 + 256 * 256)
    assert report.stage_memory[1].cuda_graph_bytes == 1 * 2 * (2 * 131072 + 256 * 256)
    # made at capture for every micro-batch slot and kept for the run: still allocated between steps
    # (the goldens' mem-allocated-bytes of the CUDA-graph functional tests, docs/memory.md)
    first = report.stage_memory[0]
    assert first.steady_bytes == (first.weights_bytes + first.gradients_bytes + first.optimizer_bytes
                                  + first.workspace_bytes + first.cuda_graph_bytes)


def test_graphs_shorten_the_step_and_keep_the_breakdown_sum():
    parallel = et.ParallelConfig(global_batch_size=64, micro_batch_size=2, use_distributed_optimizer=True)
    eager = et.simulate(LLAMA8, H100, 8, parallel)
    for impl in ("local", "transformer_engine", "full_iteration"):
        graphed = et.simulate(LLAMA8, H100, 8, parallel.replace(cuda_graph_impl=impl))
        assert graphed.step_time_s < eager.step_time_s
        assert sum(graphed.breakdown_s.values()) == pytest.approx(graphed.step_time_s, rel=1e-12)


def test_megatron_spellings_and_migrations():
    _, fields, _, _ = parse_megatron_line("--cuda-graph-impl local --cuda-graph-scope full_iteration")
    parallel = BASE.replace(**fields)
    assert cuda_graph_setting(parallel) == ("full_iteration", ())
    assert cuda_graph_setting(BASE.replace(enable_cuda_graph=True)) == ("local", ())
    assert cuda_graph_setting(BASE.replace(external_cuda_graph=True)) == ("transformer_engine", ())
    assert cuda_graph_setting(BASE.replace(cuda_graph_scope=("full",), cuda_graph_impl="local")) == ("local", ())
    # the local implementation captures router and preprocess together (transformer_config.py)
    assert cuda_graph_setting(BASE.replace(cuda_graph_impl="local", cuda_graph_modules=("moe_preprocess",)))[1] \
        == ("moe_preprocess", "moe_router")
    flags = to_megatron_flags({}, parallel.to_dict(), "bf16")
    assert flags[flags.index("--cuda-graph-scope") + 1] == "full_iteration" and "--cuda-graph-impl" in flags
    assert "--cuda-graph-impl" not in to_megatron_flags({}, BASE.to_dict(), "bf16")
    assert "--cuda-graph-warmup-steps" not in to_megatron_flags({}, BASE.to_dict(), "bf16")


@pytest.mark.parametrize("changes, match", [
    (dict(enable_cuda_graph=True, cuda_graph_impl="local"), "replace `--cuda-graph-impl`"),
    (dict(enable_cuda_graph=True, external_cuda_graph=True), "same time"),
    (dict(cuda_graph_scope=("attn",), cuda_graph_modules=("mlp",)), "cannot be used together"),
    (dict(cuda_graph_impl="full_iteration", cuda_graph_modules=("attn",)), "must be empty"),
    (dict(cuda_graph_impl="local", cuda_graph_modules=("moe_router",)), "only supported for MoE"),
    (dict(cuda_graph_impl="transformer_engine", cuda_graph_modules=("moe_preprocess",)), "moe_router"),
    (dict(cuda_graph_impl="local", cuda_graph_modules=("full", "attn")), "full scope"),
    (dict(cuda_graph_impl="local", cuda_graph_modules=("mamba2",)), "not a CUDA graph module"),
    (dict(cuda_graph_impl="local", recompute_granularity="full"), "full recompute"),
    (dict(cuda_graph_impl="bogus"), "cuda_graph_impl"),
])
def test_megatron_refusals(changes, match):
    with pytest.raises(ConfigError, match=match):
        et.simulate(TINY, H100, 1, BASE.replace(**changes))


def test_full_recompute_with_the_full_iteration_graph_and_dropout_rules():
    et.simulate(TINY, H100, 1, BASE.replace(cuda_graph_impl="full_iteration", recompute_granularity="full"))
    dropout = dataclasses.replace(TINY, attention_dropout=0.1)
    with pytest.raises(ConfigError, match="attention dropout"):
        et.simulate(dropout, H100, 1, BASE.replace(cuda_graph_impl="local", recompute_granularity="selective"))
    # graphing only the MLP leaves the recomputed core attention eager: allowed
    et.simulate(dropout, H100, 1, BASE.replace(cuda_graph_impl="local", cuda_graph_modules=("mlp",),
                                               recompute_granularity="selective"))


def test_whole_moe_layers_need_static_shapes():
    moe = et.load_model("mixtral-8x7b")
    parallel = et.ParallelConfig(global_batch_size=64, pipeline_model_parallel_size=4, expert_model_parallel_size=8,
                                 use_distributed_optimizer=True, cuda_graph_impl="local")
    with pytest.raises(ConfigError, match="drop-and-pad"):
        et.simulate(moe, H100, 32, parallel)
    graphed = et.simulate(moe, H100, 32, parallel.replace(cuda_graph_modules=("attn", "moe_router", "moe_preprocess")))
    eager = et.simulate(moe, H100, 32, parallel.replace(cuda_graph_impl="none"))
    assert graphed.step_time_s < eager.step_time_s
