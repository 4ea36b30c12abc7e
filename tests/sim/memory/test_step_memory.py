"""``step_memory``: a step's memory without its timing is the memory ``simulate`` reports, number for number."""

import random
from pathlib import Path

import pytest

import echo_tune as et
from echo_tune.errors import ConfigError
from echo_tune.search import check_space, load_space
from echo_tune.sim.memory.step_memory import step_memory

SPACES = Path(__file__).resolve().parents[3] / "search_spaces"
H100 = et.load_cluster("h100-sxm")
GIB = 2**30


def _same(model, cluster, num_gpus, parallel, layout=None, headroom=0):
    report = et.simulate(model, cluster, num_gpus, parallel, memory_headroom_bytes=headroom, layout=layout)
    memory = step_memory(model, cluster, num_gpus, parallel, memory_headroom_bytes=headroom, layout=layout)
    assert memory.stage_memory == report.stage_memory
    assert memory.peak_memory_bytes == report.peak_memory_bytes
    assert memory.memory_capacity_bytes == report.memory_capacity_bytes
    assert memory.fits_memory == report.fits_memory
    assert memory.memory_overshoot_bytes == report.memory_overshoot_bytes
    assert memory.worst_stage == report.worst_stage
    assert all(report.config[k] == v for k, v in memory.derived.items()) and memory.derived
    return memory


@pytest.mark.parametrize("space_file", ["small-gpt7b-16xa100.yaml", "mixtral-8x7b-64xh100.yaml"])
def test_the_memory_of_every_sampled_layout_is_the_simulated_one(space_file):
    space = load_space(SPACES / space_file)
    valid, _ = check_space(space)
    sample = random.Random(0).sample(valid, min(60, len(valid)))
    fits = set()
    for c in sample:
        memory = _same(c.model, space.cluster, c.num_gpus, c.parallel, c.layout,
                       int(space.memory_headroom_gib * GIB))
        fits.add(memory.fits_memory)
    assert fits == {True, False}  # both outcomes among them: the comparison covers each


def test_deferred_embedding_wgrad_buffers_and_mtp_layers_are_counted_as_simulate_counts_them():
    tiny = et.load_model("tests/data/tiny-llama.yaml")
    parallel = et.ParallelConfig(pipeline_model_parallel_size=2, global_batch_size=8,
                                 defer_embedding_wgrad_compute=True)
    deferred = _same(tiny, H100, 2, parallel)
    plain = _same(tiny, H100, 2, parallel.replace(defer_embedding_wgrad_compute=False))
    assert deferred.stage_memory[-1].activations_bytes > plain.stage_memory[-1].activations_bytes
    deepseek = et.load_model("deepseek-v3")  # one MTP layer on the last stage
    _same(deepseek, H100, 256, et.ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=8,
                                                 pipeline_model_parallel_layout="Et|(tt|)*30mL",
                                                 expert_model_parallel_size=32, expert_tensor_parallel_size=1,
                                                 global_batch_size=256,
                                                 use_distributed_optimizer=True, sequence_parallel=True,
                                                 recompute_granularity="full", recompute_method="uniform",
                                                 recompute_num_layers=1))


def test_fine_grained_offloading_needs_the_timing_and_a_broken_rule_is_refused():
    llama = et.load_model("llama3-8b")
    base = et.ParallelConfig(global_batch_size=8, use_distributed_optimizer=True)
    off = base.replace(fine_grained_activation_offloading=True, offload_modules=("core_attn", "attn_proj"))
    assert step_memory(llama, H100, 8, off) is None  # it drains activations while a forward runs
    assert step_memory(llama, H100, 8, base) is not None
    with pytest.raises(ConfigError):
        step_memory(llama, H100, 8, base.replace(tensor_model_parallel_size=3))
