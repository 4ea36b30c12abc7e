"""End-to-end properties of simulate(): named sum, bounds, monotonicity, memory vs Korthikanti."""

import dataclasses

import pytest

import echo_tune as et
from echo_tune.cost.profile import LinkCoefficients, default_profile
from echo_tune.sim.outputs.flops import hardware_flops_per_step
from echo_tune.workload import trace_embedding

GPT3 = et.load_model("gpt3-175b")
A100 = et.load_cluster("a100-80gb")
BASE = et.ParallelConfig(tensor_model_parallel_size=8, pipeline_model_parallel_size=16, micro_batch_size=1,
                         global_batch_size=1536, recompute_granularity="full")


def sim(parallel=BASE, model=GPT3, num_gpus=1024, **kw):
    return et.simulate(model, A100, num_gpus, parallel, **kw)


def test_step_is_the_sum_of_named_parts():
    report = sim()
    assert tuple(report.breakdown_s) == et.BREAKDOWN_PARTS
    assert sum(report.breakdown_s.values()) == pytest.approx(report.step_time_s, rel=1e-12)
    assert all(v >= -1e-9 for v in report.breakdown_s.values())
    assert report.breakdown_s["other"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("parallel", [
    BASE,
    BASE.replace(recompute_granularity=None, pipeline_model_parallel_size=8, micro_batch_size=2),
    BASE.replace(sequence_parallel=True, use_distributed_optimizer=True, overlap_grad_reduce=True,
                 overlap_param_gather=True, tp_comm_overlap=True, recompute_granularity="selective"),
    BASE.replace(virtual_pipeline_model_parallel_size=3, recompute_granularity="full"),
])
def test_never_below_compute_lower_bound(parallel):
    report = sim(parallel)
    flops = hardware_flops_per_step(GPT3, parallel.global_batch_size, parallel.recompute_granularity)
    lower_bound = flops / (1024 * A100.gpu.peak_bf16_tflops * 1e12)
    assert report.step_time_s > lower_bound
    assert 0 < report.mfu < 1


def _scaled_bandwidth(profile, factor):
    comm = {scope: {name: LinkCoefficients(latency_s=c.latency_s, bus_bandwidth_gbyte_s=c.bus_bandwidth_gbyte_s * factor)
                    for name, c in table.items()} for scope, table in profile.comm.items()}
    return dataclasses.replace(profile, comm=comm)


@pytest.mark.parametrize("parallel", [BASE, BASE.replace(pipeline_model_parallel_size=4, global_batch_size=1024,
                                                         use_distributed_optimizer=True, overlap_grad_reduce=True)])
def test_more_bandwidth_never_slower(parallel):
    profile = default_profile(A100)
    times = [sim(parallel, profile=_scaled_bandwidth(profile, f)).step_time_s for f in (0.5, 1.0, 2.0, 4.0)]
    assert times == sorted(times, reverse=True)


def test_more_micro_batches_never_raise_bubble_fraction():
    fractions = []
    for gbs in (128, 256, 512, 1024):
        report = sim(BASE.replace(global_batch_size=gbs))
        fractions.append(report.breakdown_s["pp_bubble"] / report.step_time_s)
    assert fractions == sorted(fractions, reverse=True)


def test_interleaving_shrinks_the_bubble():
    """v=3 divides the fill/drain bubble by 3 (engine tests); the embedding and output layers on the
    first/last stage add an imbalance that interleaving does not remove, so the total shrinks less."""
    plain = sim(BASE)
    interleaved = sim(BASE.replace(virtual_pipeline_model_parallel_size=3))
    assert interleaved.breakdown_s["pp_bubble"] < 0.6 * plain.breakdown_s["pp_bubble"]
    assert interleaved.step_time_s < plain.step_time_s


def test_gpipe_holds_more_activations_than_1f1b():
    parallel = BASE.replace(recompute_granularity=None, global_batch_size=512)  # m = 64 = 4p
    assert sim(parallel, schedule="gpipe").stage_memory[0].activations_bytes > \
        3.9 * sim(parallel).stage_memory[0].activations_bytes


def korthikanti_layer_bytes(model, tp, sp, b=1):
    s, h, a = model.seq_length, model.hidden_size, model.num_attention_heads
    if sp:
        return s * b * h / tp * (34 + 5 * a * s / h)
    return s * b * h * (10 + 24 / tp + 5 * a * s / (h * tp))


@pytest.mark.parametrize("sp", [False, True])
def test_first_stage_activations_match_korthikanti(sp):
    """Korthikanti et al. 2022 (arXiv 2205.05198): under 1F1B the first stage holds p micro-batches of
    L/p layers = L layers' worth, independent of p. Our traced count adds the embedding's output and
    dropout mask on stage 0 (and LayerNorm mean/rstd, a few KB), hence a 1% tolerance."""
    parallel = BASE.replace(recompute_granularity=None, sequence_parallel=sp)
    mem = sim(parallel).stage_memory[0]
    expected = GPT3.num_layers * korthikanti_layer_bytes(GPT3, 8, sp)
    assert mem.activations_bytes == pytest.approx(expected, rel=0.01)


def test_full_recompute_keeps_layer_inputs_only():
    """Full recompute keeps 2sbh/t bytes per layer (the checkpoint input, SP-sharded) for p in-flight
    micro-batches of L/p layers, plus one layer recomputed at a time, plus the embedding's dropout
    mask of each in-flight micro-batch on stage 0."""
    parallel = BASE.replace(sequence_parallel=True)
    mem = sim(parallel).stage_memory[0]
    s, h, t, L, p = GPT3.seq_length, GPT3.hidden_size, 8, GPT3.num_layers, 16
    embedding = trace_embedding(GPT3, tensor_model_parallel_size=t, sequence_parallel=True).activation_bytes
    # the dropout mask (one byte per element) plus the int64 token / position ids the lookups keep
    assert s * h // t < embedding < s * h // t + 16 * s
    expected = L * 2 * s * h / t + korthikanti_layer_bytes(GPT3, t, True) + p * embedding
    assert mem.activations_bytes == pytest.approx(expected, rel=0.002)


def test_optimizer_bytes_follow_megatron_table():
    report = sim(BASE.replace(use_distributed_optimizer=True))
    mem = report.stage_memory[1]
    params = mem.weights_bytes / 2
    assert mem.gradients_bytes == pytest.approx(4 * params, rel=1e-6)
    assert mem.optimizer_bytes == pytest.approx(12 * params / 8, rel=1e-6)


def test_out_of_memory_is_reported_not_raised():
    report = sim(BASE.replace(recompute_granularity=None, micro_batch_size=4, pipeline_model_parallel_size=4,
                              global_batch_size=1024), num_gpus=1024)
    assert not report.fits_memory
    assert report.memory_overshoot_bytes > 0
    assert "does not fit: stage 0" in report.memory_verdict()


def test_deterministic():
    assert sim().to_dict() == sim().to_dict()


@pytest.mark.parametrize("name", ["gpt-1.7b", "llama3-8b"])
def test_single_stage_holds_every_parameter_once(name):
    model = et.load_model(name)
    report = et.simulate(model, A100, 8, et.ParallelConfig(global_batch_size=8))
    assert report.stage_memory[0].weights_bytes == 2 * model.num_params()


def test_selective_recompute_drops_korthikanti_attention_term():
    """Selective recompute keeps 34 sbh/t per layer instead of sbh/t (34 + 5as/h) (TP + SP)."""
    parallel = BASE.replace(recompute_granularity="selective", sequence_parallel=True)
    full = BASE.replace(recompute_granularity=None, sequence_parallel=True)
    saved = sim(full).stage_memory[0].activations_bytes - sim(parallel).stage_memory[0].activations_bytes
    s, a, t, L = GPT3.seq_length, GPT3.num_attention_heads, 8, GPT3.num_layers
    assert saved == pytest.approx(L * 5 * a * s * s / t, rel=1e-9)


def test_a_checked_layout_is_reused_only_for_the_settings_it_was_checked_for():
    from echo_tune.config.rules.compatibility import check_compatible

    layout = check_compatible(GPT3, A100, 1024, BASE)
    assert sim(layout=layout).to_dict() == sim().to_dict()
    # Megatron-FSDP changes the settings in effect (the distributed optimizer on): a layout checked for the
    # settings as given is not taken, the rules run again on the ones in effect
    fsdp = et.ParallelConfig(use_megatron_fsdp=True, global_batch_size=64, micro_batch_size=1)
    small = et.load_model("llama3-8b")
    stale = check_compatible(small, A100, 8, fsdp.replace(micro_batch_size=8))  # 1 micro-batch, not 8
    report = et.simulate(small, A100, 8, fsdp, layout=stale)
    assert report.config["num_micro_batches"] == 8


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_column_parallel_backward_collectives_run_beside_a_gemm(sequence_parallel):
    """Megatron-LM since 2021-09 (cf7efd4f5a) runs a column-parallel layer's dgrad all-reduce beside its wgrad
    GEMM: less exposed TP time than the code before, which ``--no-async-tensor-model-parallel-allreduce``
    simulates. With sequence parallelism the all-gather and reduce-scatter run beside their GEMMs whatever the
    flag says (layers.py asserts it off on that path); the forward is the same."""
    parallel = BASE.replace(sequence_parallel=sequence_parallel, recompute_granularity=None,
                            micro_batch_size=1, use_distributed_optimizer=True)
    overlapped, flag_off = sim(parallel), sim(parallel.replace(async_tensor_model_parallel_allreduce=False))
    if sequence_parallel:
        assert flag_off.step_time_s == overlapped.step_time_s
    else:
        assert overlapped.breakdown_s["tp_cp_comm"] < 0.8 * flag_off.breakdown_s["tp_cp_comm"]
        assert overlapped.step_time_s < flag_off.step_time_s
    assert overlapped.breakdown_s["compute"] == pytest.approx(flag_off.breakdown_s["compute"])
    from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
    flags = to_megatron_flags({}, {"async_tensor_model_parallel_allreduce": False}, "bf16")
    assert "--no-async-tensor-model-parallel-allreduce" in flags
    assert parse_megatron_line(" ".join(flags))[1]["async_tensor_model_parallel_allreduce"] is False


def test_an_async_collective_keeps_the_compute_stream_busy_for_its_exposed_part_only():
    """The host-bound model counts what the compute stream waits for: an async backward collective's exposed
    part (not nothing: the host would then look slower than the GPU; a TP8 step of a 1024-wide model on A100 with
    a 13.5 us host time per kernel gained 12% compute that way), and no more than the inline collective it was."""
    import dataclasses as dc

    model = et.load_model("llama3-8b").replace(num_layers=4, seq_length=2048, hidden_size=1024, ffn_hidden_size=4096,
                                               num_attention_heads=16, num_query_groups=16)
    profile = default_profile(A100)
    host = dc.replace(profile, fitted={"params": {"host_time_per_kernel_s": 13.5e-6}})
    parallel = et.ParallelConfig(tensor_model_parallel_size=8, global_batch_size=8)
    overlapped = et.simulate(model, A100, 8, parallel, profile=host)
    inline = et.simulate(model, A100, 8, parallel.replace(async_tensor_model_parallel_allreduce=False), profile=host)
    plain = et.simulate(model, A100, 8, parallel, profile=profile)
    assert overlapped.breakdown_s["compute"] <= inline.breakdown_s["compute"] + 1e-12
    assert overlapped.breakdown_s["compute"] < 1.02 * plain.breakdown_s["compute"]


def test_settings_that_take_the_gemm_or_the_communication_away_leave_the_collective_exposed():
    """``--delay-wgrad-compute``: TE keeps the wgrad GEMM for later and waits for the dgrad reduce-scatter at the
    end of the backward (only the input re-gather still overlaps); ``--moe-shared-expert-overlap``: the shared
    expert's linears have no TP communication of their own (the block's gathers are blocking)."""
    from echo_tune.cost.collectives.tp_overlap import async_pairs
    from echo_tune.sim.schedule.costing import _runs_async
    from echo_tune.sim.step_setup import cost_context
    from echo_tune.workload import trace_moe_layer

    model = et.load_model("deepseek-v2-lite")
    h100 = et.load_cluster("h100")
    parallel = et.ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=4,
                                 global_batch_size=16, use_distributed_optimizer=True)
    ops = trace_moe_layer(model.replace(seq_length=1024), tensor_model_parallel_size=2,
                          sequence_parallel=True, expert_model_parallel_size=4).backward

    def runs(m, p):
        ctx = cost_context(m, h100, p, et.check_compatible(m, h100, 16, p), default_profile(h100))
        return [(ops[c].collective, ops[c].region, ops[c].subregion) for c, _ in async_pairs(ops) if _runs_async(ops[c], ctx)]

    plain = runs(model, parallel)
    assert ("reduce_scatter", "moe", "shared") in plain and ("reduce_scatter", "mla_up_proj", "") in plain
    delayed = runs(model, parallel.replace(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True))
    assert delayed and all(c == "all_gather" for c, _, _ in delayed)
    shared = runs(model.replace(moe_shared_expert_overlap=True), parallel)
    assert not any(s == "shared" for _, _, s in shared) and ("reduce_scatter", "mla_up_proj", "") in shared


def test_tp_comm_overlap_does_not_reach_multi_latent_attention_models():
    """Megatron-LM's TELinear turns tp_comm_overlap off on the shared TransformerConfig when it builds MLA's down
    projection (buffer name not qkv/proj/fc1/fc2; core/extensions/transformer_engine.py at d98e8a64ddf3): an
    MLA model runs as without it, and says so; a GQA model keeps its userbuffer overlap."""
    h100 = et.load_cluster("h100")
    parallel = et.ParallelConfig(tensor_model_parallel_size=2, sequence_parallel=True, expert_model_parallel_size=4,
                                 global_batch_size=16, use_distributed_optimizer=True)
    mla = et.load_model("deepseek-v2-lite")
    on, off = et.simulate(mla, h100, 16, parallel.replace(tp_comm_overlap=True)), et.simulate(mla, h100, 16, parallel)
    assert on.step_time_s == off.step_time_s and on.breakdown_s == off.breakdown_s
    assert any("--tp-comm-overlap with multi-latent attention" in n for n in on.notes)
    dense = et.load_model("llama3-8b")
    gqa = et.ParallelConfig(tensor_model_parallel_size=8, sequence_parallel=True, global_batch_size=8)
    assert et.simulate(dense, h100, 8, gqa.replace(tp_comm_overlap=True)).step_time_s != \
        et.simulate(dense, h100, 8, gqa).step_time_s


def test_an_mla_space_holds_no_tp_comm_overlap_alias():
    from echo_tune.search.space.auto_space import auto_space
    from echo_tune.search.space.space_check import check_space

    valid, _ = check_space(auto_space(model="deepseek-v2-lite", cluster="h100", num_gpus=16, global_batch_size=64))
    assert valid and not any(c.parallel.tp_comm_overlap for c in valid)
    assert any(c.parallel.sequence_parallel and c.parallel.tensor_model_parallel_size > 1 for c in valid)
