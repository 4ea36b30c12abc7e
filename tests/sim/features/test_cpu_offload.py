"""--cpu-offloading-num-layers: Megatron's rules, the activations left on the GPU, and the exposed copies, by hand
(issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.costing import PhaseCost
from echo_tune.sim.features.cpu_offload import host_link_gbyte_s, kept_fraction, offload_costs

LLAMA8 = et.load_model("llama3-8b")  # 32 layers
H100 = et.load_cluster("h100-sxm")
BASE = et.ParallelConfig(tensor_model_parallel_size=1, global_batch_size=16, use_distributed_optimizer=True)


def test_the_flag_and_megatrons_rules():
    _, parallel, _, _ = parse_megatron_line("--cpu-offloading-num-layers 8")
    assert parallel["cpu_offloading_num_layers"] == 8
    for bad, match in ((BASE.replace(cpu_offloading_num_layers=32), "cpu_offloading_num_layers < num_layers"),
                       (BASE.replace(cpu_offloading_num_layers=4, pipeline_model_parallel_size=2),
                        "does not support pipeline parallelism"),
                       (BASE.replace(cpu_offloading_num_layers=4, recompute_granularity="full"),
                        "does not work with activation recomputation")):
        with pytest.raises(ConfigError, match=match):
            et.simulate(LLAMA8, H100, 8, bad)


def test_host_links():
    assert host_link_gbyte_s("gb200") == 225.0 == host_link_gbyte_s("gb300")  # 900 GB/s C2C, 2 GPUs, 2 ways
    assert host_link_gbyte_s("h100-sxm") == 63.0  # PCIe 5.0 x16: 32 GT/s x 16 x 128/130 / 8


def test_exposed_copies_by_hand():
    # 10 layers, 4 offloaded, 1 GB each: 1 / 63 s = 15.9 ms per copy over PCIe; a layer's forward 10 ms, backward
    # 20 ms: forward exposes 4 x 5.9 ms, backward nothing
    fwd, bwd = PhaseCost(compute_s=0.100), PhaseCost(compute_s=0.200)
    out, back = offload_costs(fwd, bwd, layers=10, offloaded=4, layer_bytes=1e9, gpu_name="h100-sxm")
    assert out.offload_s == pytest.approx(4 * (1 / 63 - 0.010)) and back.offload_s == 0.0
    none = offload_costs(fwd, bwd, layers=10, offloaded=0, layer_bytes=1e9, gpu_name="h100-sxm")
    assert none[0].total_s == none[1].total_s == 0.0


def test_offloaded_layers_leave_the_gpu_and_the_copies_show_as_offload():
    plain = et.simulate(LLAMA8, H100, 8, BASE)
    off = et.simulate(LLAMA8, H100, 8, BASE.replace(cpu_offloading_num_layers=16))
    assert kept_fraction(32, 16) == pytest.approx(17 / 32)
    a, b = plain.stage_memory[0], off.stage_memory[0]
    # the stage's activations: the embedding's and the loss's stay; the 32 layers' shrink to 17 layers' worth
    # (16 kept, one in transit); with PP 1 one micro-batch is in flight
    from echo_tune.config.rules.compatibility import check_compatible
    from echo_tune.sim.memory.stage import layer_activation_bytes
    from echo_tune.sim.schedule.passes import trace_pieces

    layout = check_compatible(LLAMA8, H100, 8, BASE)
    per_layer = layer_activation_bytes(trace_pieces(LLAMA8, BASE, layout)["layer"], layout, 1)[0]
    assert a.activations_bytes - b.activations_bytes == pytest.approx(15 * per_layer, rel=1e-6)
    # Llama-3 8B at 4k tokens on H100: ~0.6 GiB per layer over PCIe (~10 ms) against a ~10 ms layer forward
    copy_s = per_layer / 63e9
    assert plain.breakdown_s["offload"] == 0.0 and 0.0 < off.breakdown_s["offload"] <= 2 * 16 * 2 * copy_s
    assert off.step_time_s == pytest.approx(sum(off.breakdown_s.values()))
    assert any("--cpu-offloading-num-layers 16" in n for n in off.notes)
