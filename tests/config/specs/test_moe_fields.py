"""MoE dispatch / routing / overlap flags: read from a launch line, written back, Megatron's rules."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line, to_megatron_flags
from echo_tune.errors import ConfigError

LINE = ("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-router-num-groups 8 "
        "--moe-router-group-topk 4 --moe-router-fusion --moe-permute-fusion --moe-router-force-load-balancing "
        "--overlap-moe-expert-parallel-comm --delay-wgrad-compute")
DEEPSEEK = et.load_model("deepseek-v3")
H100 = et.load_cluster("h100-sxm")


def test_flags_are_read_and_written_back():
    model, parallel, _, ignored = parse_megatron_line(LINE)
    assert model == dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                         moe_router_num_groups=8, moe_router_group_topk=4, moe_router_fusion=True,
                         moe_permute_fusion=True, moe_router_force_load_balancing=True)
    assert parallel == dict(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
    assert not ignored
    written = " ".join(to_megatron_flags(model, parallel, "bf16"))
    for flag in LINE.split():
        assert flag in written


def test_shared_expert_overlap_and_deepep_legacy_flag():
    model, _, _, _ = parse_megatron_line("--moe-shared-expert-overlap --moe-enable-deepep --moe-apply-probs-on-input")
    assert model == dict(moe_shared_expert_overlap=True, moe_enable_deepep=True, moe_apply_probs_on_input=True)
    spec = DEEPSEEK.replace(moe_token_dispatcher_type="flex", moe_enable_deepep=True,
                            moe_flex_dispatcher_backend="deepep")
    assert spec.moe_dispatcher_kernel == "deepep"
    with pytest.raises(ConfigError, match="moe_enable_deepep"):
        DEEPSEEK.replace(moe_enable_deepep=True)  # not the flex dispatcher


@pytest.mark.parametrize("changes, rule", [
    (dict(moe_router_num_groups=None, moe_router_group_topk=4), "needs `moe_router_num_groups`"),
    (dict(moe_router_num_groups=7, moe_router_group_topk=2), "num_experts % moe_router_num_groups"),
    (dict(moe_router_num_groups=8, moe_router_group_topk=9), "moe_router_group_topk <= moe_router_num_groups"),
    (dict(moe_apply_probs_on_input=True), "moe_router_topk == 1"),
    (dict(moe_flex_dispatcher_backend="ncclep"), "moe_flex_dispatcher_backend"),
    (dict(moe_token_dispatcher_type="allgather", moe_shared_expert_overlap=True), "alltoall or flex"),
])
def test_megatron_routing_rules(changes, rule):
    with pytest.raises(ConfigError, match=rule):
        DEEPSEEK.replace(**changes)


def test_unmodelled_flex_backend_value_is_a_config_error_from_a_line():
    model, _, _, _ = parse_megatron_line("--moe-flex-dispatcher-backend ncclep")
    with pytest.raises(ConfigError, match="ncclep"):
        DEEPSEEK.replace(**model)
