"""TP communication overlap as TE userbuffers pair collectives with GEMMs (cost/tp_overlap.py)."""

import dataclasses

import echo_tune as et
from echo_tune.cost.profile import default_profile
from echo_tune.cost.tp_overlap import pair_methods, slowdown
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
