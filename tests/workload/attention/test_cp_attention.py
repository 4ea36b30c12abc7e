"""Context parallelism by --cp-comm-type: the collectives, their sizes and the attention work, worked by hand from
Transformer Engine d0067d0 context_parallel.py (issue 39)."""

import pytest

import echo_tune as et
from echo_tune.workload import trace_layer

# 8 heads of 64, sequence 1024, one sample, bf16: at CP 4 a rank holds 256 tokens; q, k, v, out are each
# 256 x 8 x 64 x 2 = 262,144 bytes
MODEL = et.ModelSpec(name="tiny", num_layers=2, hidden_size=512, num_attention_heads=8, ffn_hidden_size=2048,
                     seq_length=1024, vocab_size=50257, attention_backend="flash")
LOCAL = 262_144


def _trace(comm):
    return trace_layer(MODEL, tensor_model_parallel_size=1, context_parallel_size=4, cp_comm=comm)


def _collectives(ops):
    return [(op.collective, op.group, op.size_bytes) for op in ops if op.kind == "collective"]


def _attention_flops(ops):
    return sum(op.flops for op in ops if op.kind == "attention")


def test_every_type_does_the_same_attention_work():
    # a rank attends 1/4 of the causal pairs of the whole sequence, 2 x 8 heads x (QK^T 64 + PV 64) FLOPs each:
    # 2 x 8 x (1024^2 / 2) x 128 / 4 = 268,435,456
    for comm in (("p2p", 1), ("all_gather", 1), ("a2a", 4), ("a2a+p2p", 2)):
        assert _attention_flops(_trace(comm).forward) == pytest.approx(268_435_456), comm


def test_all_gather_gathers_k_and_v_forward_and_backward_and_reduce_scatters_their_gradients():
    t = _trace(("all_gather", 1))
    gathered = 4 * LOCAL  # every rank's K (or V)
    assert _collectives(t.forward) == [("all_gather", "cp", gathered)] * 2
    assert sorted(_collectives(t.backward)) == sorted([("all_gather", "cp", gathered)] * 2
                                                      + [("reduce_scatter", "cp", gathered)] * 2)
    # two attention kernels: chunk 0 (128 queries, 128 keys, causal) and chunk 7 (128 queries, all 1024 keys,
    # causal bottom-right: 128 x 1024 - 128^2 / 2 = 122,880 pairs)
    flops = sorted(op.flops for op in t.forward if op.kind == "attention")
    assert flops == pytest.approx([2 * 8 * (128 * 128 / 2) * 128, 2 * 8 * 122_880 * 128])


def test_ulysses_all_to_alls_q_k_v_and_the_output():
    t = _trace(("a2a", 4))
    assert _collectives(t.forward) == [("all_to_all", "cp", LOCAL)] * 4  # q, k, v, then the output back
    assert _collectives(t.backward) == [("all_to_all", "cp", LOCAL)] * 4  # dout, then dq, dk, dv
    # one attention kernel over the whole sequence with 8 / 4 = 2 heads
    (attn,) = [op for op in t.forward if op.kind == "attention"]
    assert attn.flops == pytest.approx(2 * 2 * (1024 * 1024 / 2) * 128)


def test_hierarchical_a2a_then_ring():
    t = _trace(("a2a+p2p", 2))
    fwd = _collectives(t.forward)
    # all-to-alls over the first level (2 ranks), then a 2-step ring over the second: one K/V exchange of the
    # gathered K and V (512 tokens, 4 heads: 262,144 bytes each)
    assert fwd.count(("all_to_all", "cp_a2a", LOCAL)) == 4
    assert fwd.count(("send_recv", "cp_p2p", 2 * LOCAL)) == 1 and len(fwd) == 5


def test_ring_is_hidden_beside_attention_the_others_are_exposed():
    from echo_tune.config.rules.compatibility import check_compatible
    from echo_tune.sim.schedule.memo import profile_for_cluster
    from echo_tune.sim.step_setup import cost_context
    from echo_tune.sim.schedule.costing import phase_cost
    from echo_tune.cost.collectives.comm import collective_time_s

    cluster = et.load_cluster("h100-sxm")
    profile = profile_for_cluster(cluster)
    for comm_type, comm in (("a2a", ("a2a", 4)), ("all_gather", ("all_gather", 1))):
        parallel = et.ParallelConfig(context_parallel_size=4, global_batch_size=2, cp_comm_type=comm_type)
        layout = check_compatible(MODEL, cluster, 8, parallel)
        ctx = cost_context(MODEL, cluster, parallel, layout, profile)
        ops = _trace(comm).forward
        cost = phase_cost(ops, ctx, region="core_attention")
        expected = sum(collective_time_s(op.collective, op.size_bytes, layout.groups["cp"], profile)
                       for op in ops if op.kind == "collective")
        assert cost.comm_exposed_s == pytest.approx(expected) and expected > 0, comm_type
