"""--cp-comm-type and --hierarchical-context-parallel-sizes: reading, Megatron's and TE's rules, the two levels'
placement (issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
from echo_tune.errors import ConfigError

MODEL = et.ModelSpec(name="tiny", num_layers=4, hidden_size=512, num_attention_heads=8, ffn_hidden_size=2048,
                     seq_length=1024, vocab_size=50257, attention_backend="flash")
H100 = et.load_cluster("h100-sxm")


def _layout(**kw):
    return check_compatible(MODEL, H100, 8, et.ParallelConfig(context_parallel_size=4, global_batch_size=2, **kw))


def test_reading_the_flags():
    _, p, _, _ = parse_megatron_line("--cp-comm-type a2a+p2p --hierarchical-context-parallel-sizes 2 2")
    assert p["cp_comm_type"] == "a2a+p2p" and p["hierarchical_context_parallel_sizes"] == (2, 2)
    # Megatron's functional-test YAML writes '2 2', which its CI puts unquoted into the shell line
    _, p, _, _ = parse_megatron_line("--hierarchical-context-parallel-sizes '2 2'")
    assert p["hierarchical_context_parallel_sizes"] == (2, 2)
    assert to_megatron_flags({}, {"cp_comm_type": "a2a"}, "bf16")[:2] == ["--cp-comm-type", "a2a"]
    assert "--cp-comm-type" not in to_megatron_flags({}, {"cp_comm_type": "p2p"}, "bf16")  # Megatron's default


@pytest.mark.parametrize("kw, match", [
    (dict(cp_comm_type="a2a+p2p"), "must be set when a2a\\+p2p"),
    (dict(cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=(2, 4)), "prod\\(hierarchical"),
    (dict(cp_comm_type="allgather"), "write all_gather"),
    (dict(cp_comm_type="ring"), "must be one of"),
    (dict(cp_comm_type="p2p a2a p2p a2a"), "different type per layer"),
])
def test_rules(kw, match):
    with pytest.raises(ConfigError, match=match):
        _layout(**kw)


def test_heads_split_over_the_all_to_all():
    # 8 heads at TP 2: 4 per rank, not divisible by an all-to-all over 8 ranks (TE asserts it)
    model = MODEL.replace(num_attention_heads=8)
    with pytest.raises(ConfigError, match="all-to-all size"):
        check_compatible(model, et.load_cluster("h100-sxm"), 16,
                         et.ParallelConfig(tensor_model_parallel_size=2, context_parallel_size=8, global_batch_size=1,
                                           cp_comm_type="a2a"))


def test_one_type_repeated_per_layer_is_that_type():
    assert _layout(cp_comm_type="a2a a2a a2a a2a").groups["cp"].size == 4


def test_hierarchical_levels_are_placed_inside_the_cp_group():
    groups = _layout(cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=(2, 2)).groups
    # TP 1: CP ranks 0-3 of one 8-GPU node; the all-to-all level is ranks {0, 1}, the ring level {0, 2}
    assert (groups["cp_a2a"].size, groups["cp_a2a"].num_nodes) == (2, 1)
    assert (groups["cp_p2p"].size, groups["cp_p2p"].num_nodes) == (2, 1)
    assert "cp_a2a" not in _layout().groups
