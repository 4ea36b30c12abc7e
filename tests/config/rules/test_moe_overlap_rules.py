"""Megatron-Core's asserts for the EP all-to-all overlap and delayed wgrad (transformer_config.py)."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.errors import ConfigError

H100 = et.load_cluster("h100-sxm")
MIXTRAL = et.load_model("mixtral-8x7b").replace(num_layers=8, seq_length=2048)
OK = dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, expert_model_parallel_size=8,
          global_batch_size=64, overlap_moe_expert_parallel_comm=True)


def check(model=MIXTRAL, **changes):
    et.check_compatible(model, H100, 32, et.ParallelConfig(**(OK | changes)))


def test_a_valid_overlap_layout_passes():
    check()
    check(delay_wgrad_compute=True)


@pytest.mark.parametrize("model, changes, rule", [
    (MIXTRAL, dict(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=True), "delay_wgrad_compute"),
    (MIXTRAL, dict(virtual_pipeline_model_parallel_size=None), "virtual pipeline"),
    (MIXTRAL, dict(expert_model_parallel_size=1), "expert parallelism"),
    (MIXTRAL.replace(moe_token_dispatcher_type="allgather"), {}, "alltoall or flex"),
    (MIXTRAL, dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
     "full recompute"),
    (MIXTRAL, dict(recompute_granularity="selective", recompute_modules=("moe",)), "recompute_modules"),
    (MIXTRAL, dict(precision="fp32"), "bf16 or fp16"),
    (MIXTRAL.replace(moe_shared_expert_intermediate_size=4096, moe_shared_expert_overlap=True), {},
     "moe_shared_expert_overlap"),
    (MIXTRAL.replace(mtp_num_layers=2), {}, "MTP"),
])
def test_megatron_overlap_rules(model, changes, rule):
    with pytest.raises(ConfigError, match=rule):
        check(model, **changes)


def test_a_pipeline_layout_sets_the_virtual_pipeline_the_overlap_needs():
    # Megatron-LM d98e8a64ddf3 arguments.py: the layout's chunk count / PP is the VPP (8 / 2 = 4 here), which
    # transformer_config.py's EP-overlap assert then sees; functional test
    # moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_experimental runs exactly this
    from echo_tune.config.rules.moe_overlap_rules import check_moe_overlap
    model = et.ModelSpec(num_layers=16, hidden_size=64, num_attention_heads=4, seq_length=128, vocab_size=256,
                         num_experts=4, moe_router_topk=2, moe_token_dispatcher_type="alltoall",
                         mtp_num_layers=1)
    parallel = et.ParallelConfig(pipeline_model_parallel_size=2, expert_model_parallel_size=4,
                                 pipeline_model_parallel_layout="Et*3|(tt|)*6tmL", global_batch_size=8,
                                 overlap_moe_expert_parallel_comm=True)
    check_moe_overlap(model, parallel)  # no error
    with pytest.raises(ConfigError, match="needs a virtual pipeline"):
        check_moe_overlap(model, parallel.replace(pipeline_model_parallel_layout="Et*8|t*8mL"))
