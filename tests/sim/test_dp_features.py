"""--overlap-param-gather-with-optimizer-step and --num-distributed-optimizer-instances."""

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import GroupPlacement
from echo_tune.cost.collectives.comm import collective_time_s
from echo_tune.cost.profile import profile_for
from echo_tune.errors import ConfigError
from echo_tune.sim.data_parallel.dp import OPTIMIZER_BYTES_PER_PARAM, param_gather_hidden_s
from echo_tune.sim.data_parallel.dp_instances import gradient_reduction_s, instance_groups

LLAMA8 = et.load_model("llama3-8b")
H100 = et.load_cluster("h100-sxm")
INTERLEAVED = et.ParallelConfig(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                                global_batch_size=64, use_distributed_optimizer=True, overlap_grad_reduce=True,
                                overlap_param_gather=True)


def test_hidden_gather_is_bounded_by_the_other_chunks_optimizer_time():
    # Adam of 2 s over 100 params, 25 of them in the first chunk: 1.5 s of other chunks' optimizer step
    assert param_gather_hidden_s(1.0, 2.0, 25, 100) == pytest.approx(1.0)  # all of a 1 s gather hidden
    assert param_gather_hidden_s(3.0, 2.0, 25, 100) == pytest.approx(1.5)  # at most the 1.5 s
    assert param_gather_hidden_s(3.0, 2.0, 100, 100) == 0.0  # one chunk: nothing to hide behind


def test_overlap_with_optimizer_step_shortens_the_optimizer_part_only():
    plain = et.simulate(LLAMA8, H100, 16, INTERLEAVED)
    overlapped = et.simulate(LLAMA8, H100, 16, INTERLEAVED.replace(overlap_param_gather_with_optimizer_step=True))
    saved = plain.breakdown_s["optimizer"] - overlapped.breakdown_s["optimizer"]
    assert saved > 0
    for part in ("compute", "dp_comm", "pp_bubble"):
        assert overlapped.breakdown_s[part] == pytest.approx(plain.breakdown_s[part], rel=1e-12)
    # by hand: stage 0 holds 16 layers in 2 chunks of 8 plus the embedding in chunk 0, sharded over DP 8;
    # the hidden time is at most the Adam step of chunk 1 (its 8 layers' params / 8 x 38 B at HBM speed)
    profile = profile_for(H100)
    h, kv = 4096, 1024  # Llama-3 8B: 8 KV heads of 128
    layer = 2 * h * h + 2 * h * kv + 3 * h * 14336 + 2 * h  # q, o; k, v; SwiGLU MLP; two RMSNorms
    adam_chunk1 = 8 * layer / 8 * OPTIMIZER_BYTES_PER_PARAM / (profile.memory_bandwidth_gbyte_s * 1e9)
    assert saved <= adam_chunk1 * 1.0001
    assert sum(overlapped.breakdown_s.values()) == pytest.approx(overlapped.step_time_s, rel=1e-12)


def test_overlap_with_optimizer_step_rules():
    with pytest.raises(ConfigError, match="interleaved"):
        et.simulate(LLAMA8, H100, 16, INTERLEAVED.replace(virtual_pipeline_model_parallel_size=None,
                                                          overlap_param_gather_with_optimizer_step=True))
    with pytest.raises(ConfigError, match="overlap-param-gather"):
        et.simulate(LLAMA8, H100, 16, INTERLEAVED.replace(overlap_param_gather=False,
                                                          overlap_param_gather_with_optimizer_step=True))


def test_instance_groups_by_hand():
    dp = GroupPlacement(size=16, ranks_per_node=8, num_nodes=2)
    intra, inter = instance_groups(dp, 2)  # two instances of 8 consecutive ranks: one node each
    assert (intra.size, intra.ranks_per_node, intra.num_nodes) == (8, 8, 1)
    assert (inter.size, inter.ranks_per_node, inter.num_nodes) == (2, 1, 2)
    intra, inter = instance_groups(dp, 4)  # 4 ranks per instance, 2 instances per node
    assert (intra.size, intra.ranks_per_node, intra.num_nodes) == (4, 4, 1)
    assert (inter.size, inter.ranks_per_node, inter.num_nodes) == (4, 2, 2)
    profile = profile_for(H100)
    size = 1 << 28
    expected = (collective_time_s("reduce_scatter", size, GroupPlacement(size=4, ranks_per_node=4, num_nodes=1),
                                  profile)
                + collective_time_s("all_reduce", size / 4, GroupPlacement(size=4, ranks_per_node=2, num_nodes=2),
                                    profile))
    assert gradient_reduction_s("reduce_scatter", size, dp, 4, profile) == pytest.approx(expected, rel=1e-12)
    assert gradient_reduction_s("reduce_scatter", size, dp, 1, profile) == collective_time_s(
        "reduce_scatter", size, dp, profile)


def test_instances_multiply_the_optimizer_shard_and_keep_the_sum():
    parallel = et.ParallelConfig(global_batch_size=64, use_distributed_optimizer=True, overlap_grad_reduce=True)
    one = et.simulate(LLAMA8, H100, 16, parallel)
    two = et.simulate(LLAMA8, H100, 16, parallel.replace(num_distributed_optimizer_instances=2))
    assert two.stage_memory[0].optimizer_bytes == pytest.approx(2 * one.stage_memory[0].optimizer_bytes, rel=1e-6)
    assert two.stage_memory[0].weights_bytes == one.stage_memory[0].weights_bytes
    assert sum(two.breakdown_s.values()) == pytest.approx(two.step_time_s, rel=1e-12)
    with pytest.raises(ConfigError, match="num_distributed_optimizer_instances"):
        et.simulate(LLAMA8, H100, 16, parallel.replace(num_distributed_optimizer_instances=3))


def test_instances_shard_the_experts_optimizer_over_the_intra_partial_expert_group():
    # Megatron-LM d98e8a64ddf3 distributed_data_parallel.py: expert buffers use ``intra_expt_dp_group``, of
    # size expert DP / N (parallel_state.py): the experts' optimizer states double with N = 2 as the others do
    mixtral = et.load_model("mixtral-8x7b")
    parallel = et.ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=4,
                                 expert_model_parallel_size=8, expert_tensor_parallel_size=1, sequence_parallel=True,
                                 global_batch_size=64, use_distributed_optimizer=True)  # expert DP 64 / (4 x 8) = 2
    one = et.simulate(mixtral, H100, 64, parallel).stage_memory[0]
    two = et.simulate(mixtral, H100, 64, parallel.replace(num_distributed_optimizer_instances=2)).stage_memory[0]
    assert two.optimizer_bytes == pytest.approx(2 * one.optimizer_bytes, rel=1e-6)


def test_dense_gradients_reduce_over_data_and_context_parallel_ranks():
    """Megatron-Core's DDP reduces dense gradients over intra_dp_cp_group: on 8 GPUs without the distributed
    optimizer the all-reduce spans 8 ranks whatever the CP size (it spanned DP only, 2 ranks at CP 4)."""
    import echo_tune as et

    model, cluster = et.load_model("llama3-8b"), et.load_cluster("h100-sxm")
    one = et.simulate(model, cluster, 8, et.ParallelConfig(global_batch_size=8))
    cp4 = et.simulate(model, cluster, 8, et.ParallelConfig(global_batch_size=8, context_parallel_size=4))
    assert cp4.breakdown_s["dp_comm"] == pytest.approx(one.breakdown_s["dp_comm"], rel=0.02)


def test_a_gradient_bucket_is_slowed_only_while_the_compute_runs_so_the_tail_is_monotone():
    """A bucket that runs past the compute end is slowed by comm_slowdown only until then: a chunk's gradients
    ready later (compute end fixed) never end the reduction sooner, as they did when the whole bucket was
    slowed (a review's counterexample to the recompute dominance rule, search/space/dominance.py); the closed form,
    the bucket-by-bucket loop and the expert loop agree."""
    import dataclasses

    from echo_tune.sim.data_parallel.dp import _slowed_end, stage_tail

    assert _slowed_end(0.0, 1.0, 10.0, 1.5) == 1.5  # all of it beside the compute
    assert _slowed_end(9.0, 1.0, 10.0, 2.0) == pytest.approx(10.5)  # half done by 10 s, the rest at full speed
    assert _slowed_end(10.0 - 1e-12, 1.0, 10.0, 2.0) == pytest.approx(11.0)  # continuous at the compute end
    profile = dataclasses.replace(profile_for(H100), comm_slowdown=1.5)
    par = et.ParallelConfig(global_batch_size=64, use_distributed_optimizer=True, overlap_grad_reduce=True)
    dp = GroupPlacement(size=64, ranks_per_node=8, num_nodes=8)
    edp = GroupPlacement(size=8, ranks_per_node=8, num_nodes=1)
    for experts in (None, [300_000_000, 300_000_000]):
        ends = []
        for k in range(60):
            last = 9.95 + k * 0.001  # chunk 1's last backward ends later and later, the compute at 10 s
            kw = dict(parallel=par, dp=dp, profile=profile, chunk_params=[400_000_000, 400_000_000],
                      chunk_backward=[(5.0, 8.0), (8.0, last)], compute_end_s=10.0,
                      expert_chunk_params=experts, edp=edp if experts else None)
            closed, spans = stage_tail(**kw), []
            looped = stage_tail(**kw, spans=spans)  # the bucket-by-bucket loop (it records spans)
            assert closed.dp_exposed_s == pytest.approx(looped.dp_exposed_s, rel=1e-12)
            ends.append(closed.dp_exposed_s)
        assert all(b >= a - 1e-12 for a, b in zip(ends, ends[1:])) and ends[-1] > ends[0]
