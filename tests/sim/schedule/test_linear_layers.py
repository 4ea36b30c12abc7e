"""Gated-delta-net layers in a simulated step: which layers, their parameters and activations, Megatron's rules
(issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.errors import ConfigError
from echo_tune.sim.schedule.linear_layers import chunk_linear_mix
from echo_tune.sim.memory.stage import bytes_per_param
from echo_tune.sim.schedule.passes import trace_pieces

H100 = et.load_cluster("h100-sxm")
MODEL = et.ModelSpec(name="gdn", num_layers=6, hidden_size=512, num_attention_heads=8, num_query_groups=2,
                     seq_length=1024, vocab_size=50257, swiglu=True, normalization="RMSNorm",
                     experimental_attention_variant="gdn", linear_attention_freq=3, linear_key_head_dim=64,
                     linear_value_head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8)
ATTENTION = MODEL.replace(experimental_attention_variant=None, linear_attention_freq=None)
BASE = et.ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, sequence_parallel=True,
                         micro_batch_size=4, global_batch_size=32, use_distributed_optimizer=True)


def test_which_layers_each_stage_holds():
    layout = check_compatible(MODEL, H100, 8, BASE)
    # pattern (1, 1, 0, 1, 1, 0): three layers per stage, two of them gated delta nets, all dense
    assert chunk_linear_mix(MODEL, layout) == (((2, 0),), ((2, 0),))


def test_weights_and_activations_follow_the_layers():
    gdn, plain = et.simulate(MODEL, H100, 8, BASE), et.simulate(ATTENTION, H100, 8, BASE)
    layout = check_compatible(MODEL, H100, 8, BASE)
    pieces = trace_pieces(MODEL, BASE, layout)
    per_layer = pieces["linear_layer"].param_count - pieces["layer"].param_count
    w = bytes_per_param(BASE, layout.data_parallel_size, 1)[0]
    for s in (0, 1):  # two gated delta nets per stage
        assert gdn.stage_memory[s].weights_bytes - plain.stage_memory[s].weights_bytes == pytest.approx(
            2 * per_layer * w)
    assert gdn.step_time_s != plain.step_time_s
    assert gdn.stage_memory[0].activations_bytes != plain.stage_memory[0].activations_bytes


@pytest.mark.parametrize("kw, match", [
    (dict(context_parallel_size=2, tensor_model_parallel_size=1, pipeline_model_parallel_size=1),
     "not modelled beside context parallelism"),
    (dict(tensor_model_parallel_size=8, pipeline_model_parallel_size=1), "linear_num_key_heads %"),
])
def test_rules(kw, match):
    with pytest.raises(ConfigError, match=match):  # 8 query groups: TP 8 splits the attention, not 4 key heads
        et.simulate(MODEL.replace(num_query_groups=8), H100, 8, BASE.replace(**kw))
