"""TP communication overlap as TE userbuffers pair collectives with GEMMs (cost/collectives/tp_overlap.py)."""

import dataclasses

import echo_tune as et
from echo_tune.cost.profile import default_profile
from echo_tune.cost.collectives.tp_overlap import pair_methods, slowdown
from echo_tune.workload import trace_layer

LLAMA70 = et.load_model("llama3-70b")
H100 = et.load_cluster("h100-sxm")


def _layer():
    return trace_layer(LLAMA70, tensor_model_parallel_size=4, context_parallel_size=1, sequence_parallel=True,
                       micro_batch_size=1, precision="bf16")


def test_methods_follow_te_defaults():
    layer = _layer()
    fwd = {(layer.forward[c].region, layer.forward[c].collective): m for c, _, m in pair_methods(layer.forward)}
    assert fwd == {("qkv", "all_gather"): "ring_exchange", ("attention_proj", "reduce_scatter"): "pipeline",
                   ("mlp", "all_gather"): "ring_exchange", ("mlp", "reduce_scatter"): "pipeline"}
    bwd = [(layer.backward[c].region, layer.backward[c].collective, m) for c, _, m in pair_methods(layer.backward)]
    assert ("attention_proj", "all_gather", "ring_exchange") in bwd  # proj dgrad gathers dY
    assert ("qkv", "all_gather", "bulk") in bwd and ("qkv", "reduce_scatter", "bulk") in bwd
    assert sorted(m for *_, m in bwd).count("bulk") == 4  # qkv and fc1: input all-gather, dgrad reduce-scatter


def test_overlap_hides_part_of_tp_comm_and_slows_gemms():
    parallel = et.ParallelConfig(tensor_model_parallel_size=4, pipeline_model_parallel_size=4, sequence_parallel=True,
                                 global_batch_size=64)
    plain = et.simulate(LLAMA70, H100, 64, parallel)
    overlapped = et.simulate(LLAMA70, H100, 64, parallel.replace(tp_comm_overlap=True))
    assert overlapped.breakdown_s["tp_cp_comm"] < plain.breakdown_s["tp_cp_comm"]
    assert overlapped.breakdown_s["tp_cp_comm"] > 0  # the pipelined reduce-scatter's last chunk stays exposed
    assert overlapped.breakdown_s["interference"] > plain.breakdown_s["interference"]
    assert overlapped.step_time_s < plain.step_time_s


def test_fitted_curve_replaces_the_scalar():
    profile = default_profile(H100)
    assert slowdown(profile, "compute", 1e6) == profile.compute_slowdown
    curved = dataclasses.replace(profile, slowdown_curves={"compute": {"amplitude": 0.2, "half_size_bytes": 1e6}})
    assert slowdown(curved, "compute", 1e6) == 1.1 and slowdown(curved, "compute", 1e9) > 1.19
    kinds = dataclasses.replace(curved, slowdown_curves={**curved.slowdown_curves, "compute_gemm": {"median": 1.3}})
    assert slowdown(kinds, "compute", 1e6, "gemm") == 1.3


def test_backward_collectives_megatron_runs_asynchronously_are_paired_with_their_gemm():
    """Without userbuffers a column-parallel layer's dgrad reduction runs beside its wgrad GEMM and, with
    sequence parallelism, its input all-gather beside its dgrad GEMM; a row-parallel layer's dY all-gather
    feeds both its GEMMs (Megatron-LM d98e8a64ddf3 core/tensor_parallel/layers.py)."""
    import echo_tune as et
    from echo_tune.cost.collectives.tp_overlap import async_pairs
    from echo_tune.workload import trace_layer

    model = et.load_model("llama3-8b").replace(num_layers=2, seq_length=1024)
    plain = trace_layer(model, tensor_model_parallel_size=2, sequence_parallel=False).backward
    pairs = async_pairs(plain)
    assert [plain[c].collective for c, _ in pairs] == ["all_reduce", "all_reduce"]  # fc1's and qkv's dgrad
    for c, g in pairs:  # each beside the wgrad GEMM that follows it in its own layer
        assert plain[g].kind == "gemm" and plain[g].region == plain[c].region and g == c + 1
    sp = trace_layer(model, tensor_model_parallel_size=2, sequence_parallel=True).backward
    kinds = [sp[c].collective for c, _ in async_pairs(sp)]
    assert kinds == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]  # fc1's and qkv's
    every_tp = [op.collective for op in sp if op.kind == "collective" and op.group == "tp"]
    assert len(every_tp) == 6  # fc2's and proj's dY all-gathers stay on the critical path


def test_an_async_collective_is_exposed_only_past_its_gemm():
    import echo_tune as et
    from echo_tune.cost.profile import default_profile
    from echo_tune.cost.collectives.tp_overlap import async_cost

    profile = default_profile(et.load_cluster("h100"))
    exposed, extra = async_cost(1e-3, 4e-3, 1e6, profile)
    assert exposed == 0.0 and extra >= 0.0
    exposed, _ = async_cost(5e-3, 1e-3, 1e6, profile)
    assert exposed > 4e-3 - 1e-12
