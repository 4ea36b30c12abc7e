"""Expert parallelism: Megatron-Core's EP / ETP rules and the parallel-folding placement of expert groups."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.errors import ConfigError

H100 = et.load_cluster("h100-sxm")
MIXTRAL = et.load_model("mixtral-8x7b")


def layout(num_gpus=64, model=MIXTRAL, **kw):
    kw.setdefault("global_batch_size", 256)
    return check_compatible(model, H100, num_gpus, et.ParallelConfig(**kw))


def test_folding_carves_expert_groups_from_tp_cp_dp():
    # TP1 PP4 -> DP16 per stage; EP8 (ETP1): experts on 8 neighbouring ranks, EDP = 16 / 8 = 2
    lay = layout(pipeline_model_parallel_size=4, expert_model_parallel_size=8)
    assert lay.expert_data_parallel_size == 2
    ep = lay.groups["ep"]
    assert (ep.size, ep.ranks_per_node, ep.num_nodes) == (8, 8, 1)  # the all-to-all stays on NVLink
    edp = lay.groups["edp"]
    assert (edp.size, edp.num_nodes) == (2, 2)


def test_ep_beyond_a_node_when_etp_is_inside():
    # TP4 (ETP = TP by default) x EP8: EP ranks are 4 apart -> 2 per node over 4 nodes
    lay = layout(tensor_model_parallel_size=4, sequence_parallel=True, expert_model_parallel_size=8)
    ep, etp = lay.groups["ep"], lay.groups["etp"]
    assert (etp.size, etp.num_nodes) == (4, 1)
    assert (ep.size, ep.ranks_per_node, ep.num_nodes) == (8, 2, 4)
    assert lay.expert_data_parallel_size == 64 // 32
    # ETP 1 with the same TP: experts not split, EP neighbours again share a node
    lay1 = layout(tensor_model_parallel_size=4, sequence_parallel=True, expert_model_parallel_size=8,
                  expert_tensor_parallel_size=1)
    assert lay1.groups["ep"].num_nodes == 1 and lay1.expert_data_parallel_size == 8


@pytest.mark.parametrize("kw, model, rule", [
    (dict(expert_model_parallel_size=3), MIXTRAL, "num_experts % expert_model_parallel_size"),
    (dict(expert_model_parallel_size=8, pipeline_model_parallel_size=16), MIXTRAL, "carved"),
    (dict(expert_model_parallel_size=2), et.load_model("llama3-8b"), "needs an MoE model"),
    (dict(tensor_model_parallel_size=2), MIXTRAL, "sequence_parallel"),
    (dict(tensor_model_parallel_size=2, sequence_parallel=True), MIXTRAL.replace(add_bias_linear=True),
     "expert_tensor_parallel_size == 1"),
    (dict(expert_tensor_parallel_size=16), MIXTRAL.replace(moe_ffn_hidden_size=1000),
     "moe_ffn_hidden_size % expert_tensor_parallel_size"),
])
def test_megatron_rules_are_one_line_errors(kw, model, rule):
    with pytest.raises(ConfigError, match=rule) as info:
        layout(model=model, **kw)
    assert "\n" not in str(info.value)


def test_moe_layer_freq_patterns():
    m = et.load_model("deepseek-v3")
    assert m.moe_pattern == (0, 0, 0) + (1,) * 58
    assert MIXTRAL.replace(moe_layer_freq=2).moe_pattern[:4] == (1, 0, 1, 0)
    with pytest.raises(ConfigError, match="len"):
        MIXTRAL.replace(moe_layer_freq="[1]*31")
    with pytest.raises(ConfigError, match="list expression"):
        MIXTRAL.replace(moe_layer_freq="__import__('os')")


def test_moe_presets_match_published_parameter_counts():
    """Total parameters from the traced pieces (TP1, EP1) against the model cards."""
    from echo_tune.workload import trace_embedding, trace_layer, trace_moe_layer, trace_output

    published = {"mixtral-8x7b": 46.7e9, "mixtral-8x22b": 141e9, "deepseek-v3": 671e9 + 14e9,  # + MTP module
                 "deepseek-v2-lite": 15.7e9, "qwen3-30b-a3b": 30.5e9, "qwen3-235b-a22b": 235e9, "grok-1": 314e9}
    for name, total in published.items():
        m = et.load_model(name).replace(seq_length=128, mtp_num_layers=None)
        dense, moe = trace_layer(m, tensor_model_parallel_size=1), trace_moe_layer(m, tensor_model_parallel_size=1)
        k = sum(m.moe_pattern)
        count = ((m.num_layers - k) * dense.param_count + k * moe.param_count
                 + trace_embedding(m, tensor_model_parallel_size=1).param_count
                 + trace_output(m, tensor_model_parallel_size=1).param_count)
        expected = total - (14e9 if name == "deepseek-v3" else 0)
        assert count == pytest.approx(expected, rel=0.012), name
        assert m.num_params() == count, name  # the closed form agrees with the traced pieces
