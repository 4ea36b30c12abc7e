"""The flex dispatcher inside an NVLink domain: measured rows per GPU generation, EP ranks and SMs (values read off
DeepEP's legacy README and HybridEP's README, data/flex-dispatch-nvlink.yaml), the NVLink domain as the node, and the
SMs the kernels take (issue 37 / 39)."""

from __future__ import annotations

import pytest

from echo_tune.config.rules.compatibility import GroupPlacement, check_compatible
from echo_tune.config.load.loading import load_cluster, load_model
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.specs.parallel import ParallelConfig
from echo_tune.cost.collectives.flex_bandwidth import label, nvlink_gbyte_s, platform_for
from echo_tune.cost.collectives.moe_dispatch import flex_dispatch_time_s, sm_slowdown
from echo_tune.errors import ConfigError

TOKEN_BYTES = 4096 * 7168 * 2  # the READMEs' runs: 4096 tokens of hidden 7168 in bf16


def test_measured_points_are_returned_as_published():
    assert nvlink_gbyte_s("b200", "hybridep", "dispatch", 8, 16) == pytest.approx(535.94)
    assert nvlink_gbyte_s("b200", "deepep", "combine", 8, 32) == pytest.approx(524.0)
    assert nvlink_gbyte_s("gb200", "hybridep", "combine", 36, 32) == pytest.approx(447.89)
    assert nvlink_gbyte_s("h100-sxm", "deepep", "dispatch", 8, 20) == pytest.approx(153.0)


def test_interpolation_between_ranks_and_sms_and_the_ends():
    # B200 DeepEP between 16 (348) and 24 SMs (494): 20 SMs is the midpoint
    assert nvlink_gbyte_s("b200", "deepep", "dispatch", 8, 20) == pytest.approx((348 + 494) / 2)
    # past the last measured SM count the link binds: flat; below the first, proportional to the SMs
    assert nvlink_gbyte_s("b200", "deepep", "dispatch", 8, 96) == pytest.approx(646.0)
    assert nvlink_gbyte_s("b200", "deepep", "dispatch", 8, 8) == pytest.approx(348.0 / 2)
    # GB200 HybridEP at 16 SMs between 8 (550.10) and 16 ranks (472.84): 12 ranks is the midpoint
    assert nvlink_gbyte_s("gb200", "hybridep", "dispatch", 12, 16) == pytest.approx((550.10 + 472.84) / 2)
    # EP 64 inside one NVL72 rack keeps the largest measured row (36 ranks)
    assert nvlink_gbyte_s("gb200", "hybridep", "dispatch", 64, 32) == pytest.approx(479.02)


def test_platforms_and_labels():
    assert platform_for("gb300") == "gb200" and platform_for("h200-sxm") == "h800"
    assert platform_for("a100-80gb") == "h800"  # unlisted: the Hopper row, capped by the cluster's NVLink
    assert "applied to gb300" in label("gb300") and "applied to" not in label("b200")


def test_blackwell_dispatch_is_faster_than_hopper_by_the_measured_ratio():
    """One intranode HybridEP dispatch at EP 8, 16 SMs: B200's 535.94 GB/s against the Hopper row's 153 GB/s
    (DeepEP's, HybridEP publishes none for Hopper intranode), capped by each cluster's NVLink."""
    ep8 = GroupPlacement(size=8, ranks_per_node=8, num_nodes=1)
    times = {gpu: flex_dispatch_time_s("hybridep", "dispatch", 8 * TOKEN_BYTES, 8, ep8, 128, nvlink_gbyte_s=link,
                                       nic_gbyte_s=50, num_sms=16, gpu_name=gpu)
             for gpu, link in (("h100-sxm", 450.0), ("b200", 900.0))}
    assert times["h100-sxm"] / times["b200"] == pytest.approx(535.94 / 153.0)
    # a slower link than the measured rate caps it
    capped = flex_dispatch_time_s("hybridep", "dispatch", 8 * TOKEN_BYTES, 8, ep8, 128, nvlink_gbyte_s=100.0,
                                  nic_gbyte_s=50, num_sms=16, gpu_name="b200")
    assert capped == pytest.approx(times["b200"] * 535.94 / 100.0)


def test_an_nvl72_rack_is_one_node_for_the_expert_groups():
    """EP 64 on GB200 NVL72 stays on NVLink (72 GPUs per domain, 4 per tray); on B200 (8 per node) it spans 8
    nodes."""
    model = load_model("deepseek-v3")
    layout = ParallelConfig(expert_model_parallel_size=64, micro_batch_size=1, global_batch_size=1024,
                            use_distributed_optimizer=True)
    gb200 = check_compatible(model, load_cluster("gb200-nvl72"), 1024, layout).groups["ep"]
    b200 = check_compatible(model, load_cluster("b200"), 1024, layout).groups["ep"]
    assert (gb200.num_nodes, gb200.ranks_per_node) == (1, 64)
    assert (b200.num_nodes, b200.ranks_per_node) == (8, 8)


def test_the_dispatcher_sm_count_flag_and_its_deprecated_spellings():
    for flag in ("--moe-flex-dispatcher-num-sms", "--moe-hybridep-num-sms", "--moe-deepep-num-sms"):
        model, _, _, _ = parse_megatron_line(f"--num-experts 8 --moe-token-dispatcher-type flex {flag} 32")
        assert model["moe_flex_dispatcher_num_sms"] == 32, flag
    # the SMs taken from compute running beside the kernels: 148 / (148 - 32) on B200
    assert sm_slowdown("hybridep", 148, 32) == pytest.approx(148 / 116)
    assert sm_slowdown("deepep", 132) == pytest.approx(132 / 112)  # DeepEP's default 20


def test_more_dispatcher_sms_than_the_gpu_has_is_refused():
    model = load_model("qwen3-30b-a3b")
    import dataclasses
    model = dataclasses.replace(model, moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep",
                                moe_flex_dispatcher_num_sms=148)
    layout = ParallelConfig(expert_model_parallel_size=8, micro_batch_size=1, global_batch_size=64,
                            use_distributed_optimizer=True)
    with pytest.raises(ConfigError, match="moe_flex_dispatcher_num_sms < SMs of the GPU"):
        check_compatible(model, load_cluster("b200"), 8, layout)
