"""EP all-to-all overlap (combined 1F1B) and shared-expert overlap: hand-worked two-stream timelines."""

from __future__ import annotations

import pytest

import echo_tune as et
from echo_tune.sim.features.moe_overlap import (LayerParts, ep_overlap_hidden_s, layer_pair_s, paired_fraction,
                                       shared_overlap_comm_change_s, shared_overlap_hidden_s,
                                       slowed_hidden_s)
from echo_tune.sim.outputs.report import BREAKDOWN_PARTS
from echo_tune.sim.outputs.trace_tracks import COMM_TRACK


def parts(**kw):
    base = dict(pre_fwd_s=0.0, dispatch_fwd_s=0.0, experts_fwd_s=0.0, combine_fwd_s=0.0, pre_bwd_s=0.0,
                dispatch_bwd_s=0.0, experts_dgrad_s=0.0, experts_wgrad_s=0.0, combine_bwd_s=0.0)
    return LayerParts(**(base | kw))


def test_compute_rich_pair_hides_all_communication():
    # every compute node 10, every all-to-all 1: comm 4 < compute, so min(comm, compute) = 4 is hidden
    p = parts(pre_fwd_s=10, dispatch_fwd_s=1, experts_fwd_s=10, combine_fwd_s=1, pre_bwd_s=10, dispatch_bwd_s=1,
              experts_dgrad_s=10, experts_wgrad_s=10, combine_bwd_s=1)
    # comp: pre_f 0-10, dgrad 10-20, wgrad 20-30, experts_f 30-40, pre_b 40-50; comm all inside: end 50
    assert layer_pair_s(p, delay_wgrad_compute=True) == pytest.approx(50)
    assert ep_overlap_hidden_s(p, True) == pytest.approx(4) == pytest.approx(min(4, 50))


def test_comm_heavy_pair_hides_the_overlappable_compute():
    # all-to-alls 5, compute small: combine_b 0-5 (pre_f 0-1 beside it), dispatch_f 5-10 (dgrad 5-6, wgrad 6-7),
    # dispatch_b 10-15 (experts_f 10-11), combine_f 15-20 (pre_b 15-17): end 20 of a serial 26;
    # hidden = the compute beside comm = 1 + 2 + 1 + 2 = 6 = min(comm 20, compute 6)
    p = parts(pre_fwd_s=1, dispatch_fwd_s=5, experts_fwd_s=1, combine_fwd_s=5, pre_bwd_s=2, dispatch_bwd_s=5,
              experts_dgrad_s=1, experts_wgrad_s=1, combine_bwd_s=5)
    assert p.serial_s == pytest.approx(26)
    assert layer_pair_s(p, True) == pytest.approx(20)
    assert ep_overlap_hidden_s(p, True) == pytest.approx(6)


def test_all_to_alls_slowed_beside_compute_hide_less():
    # the comm-heavy pair above (all 6 of its compute beside its all-to-alls): at 1.2x slower beside compute the
    # 6 of compute move 5 of communication, at 2x 3; a compute-rich pair (50 of compute, 4 of comm) still hides all 4
    p = parts(pre_fwd_s=1, dispatch_fwd_s=5, experts_fwd_s=1, combine_fwd_s=5, pre_bwd_s=2, dispatch_bwd_s=5,
              experts_dgrad_s=1, experts_wgrad_s=1, combine_bwd_s=5)
    assert ep_overlap_hidden_s(p, True, comm_slowdown=1.2) == pytest.approx(5)
    assert ep_overlap_hidden_s(p, True, comm_slowdown=2.0) == pytest.approx(3)
    assert ep_overlap_hidden_s(p, True, comm_slowdown=1.0) == pytest.approx(6)
    rich = parts(pre_fwd_s=10, dispatch_fwd_s=1, experts_fwd_s=10, combine_fwd_s=1, pre_bwd_s=10, dispatch_bwd_s=1,
                 experts_dgrad_s=10, experts_wgrad_s=10, combine_bwd_s=1)
    assert ep_overlap_hidden_s(rich, True, comm_slowdown=1.2) == pytest.approx(4)
    assert slowed_hidden_s(4.0, 50.0, 0.9) == 4.0  # a "slowdown" below 1 is read as none


def test_delayed_wgrad_lets_the_dispatch_backward_hide_behind_the_weight_gradients():
    p = parts(pre_fwd_s=1, combine_bwd_s=1, dispatch_fwd_s=1, experts_dgrad_s=1, experts_wgrad_s=4,
              dispatch_bwd_s=4, experts_fwd_s=1, combine_fwd_s=1, pre_bwd_s=1)
    # delayed: dispatch_b starts after dgrad (2) and runs 2-6 beside wgrad 2-6; experts_f 6-7; combine_f 7-8 and
    # pre_b 7-8: end 8 of a serial 15, all 7 of comm hidden
    assert layer_pair_s(p, True) == pytest.approx(8) and ep_overlap_hidden_s(p, True) == pytest.approx(7)
    # not delayed: dispatch_b waits for the whole expert backward (6), runs 6-10; combine_f 10-11, pre_b 10-11
    assert layer_pair_s(p, False) == pytest.approx(11) and ep_overlap_hidden_s(p, False) == pytest.approx(4)


def test_paired_fraction_leaves_out_warmup_forwards():
    assert paired_fraction("interleaved", 0, 4, 8, 2) == pytest.approx((16 - (3 * 2 + 1 * 4)) / 16)
    assert paired_fraction("interleaved", 3, 4, 8, 2) == pytest.approx((16 - 4) / 16)
    assert paired_fraction("1f1b", 0, 1, 8, 1) == pytest.approx(7 / 8)  # no pipelining: the first forward alone
    assert paired_fraction("interleaved", 0, 4, 4, 2) == 0.0  # m == p: all forwards are warm-up


def test_shared_expert_overlap_hides_the_smaller():
    assert shared_overlap_hidden_s(3.0, 5.0) == 3.0 and shared_overlap_hidden_s(7.0, 5.0) == 5.0
    # the all-to-alls 1.2x as slow beside the shared expert: a 3 shared expert moves 2.5 of the 5 of comm; a 7 one
    # (at least 6 = 1.2 x 5) hides all 5, as without the slowdown
    assert shared_overlap_comm_change_s(3.0, 5.0, 1.2) == pytest.approx(-2.5)
    assert shared_overlap_comm_change_s(7.0, 5.0, 1.2) == pytest.approx(-5.0)
    assert shared_overlap_comm_change_s(3.0, 5.0) == pytest.approx(-3.0)  # no slowdown: the smaller is hidden


H100 = et.load_cluster("h100-sxm")
MIXTRAL = et.load_model("mixtral-8x7b").replace(num_layers=8, seq_length=2048)
PADDED = MIXTRAL.replace(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
LAYOUT = et.ParallelConfig(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2,
                           expert_model_parallel_size=8, global_batch_size=64)


def test_ep_overlap_lowers_ep_comm_and_the_parts_still_add_up():
    plain = et.simulate(PADDED, H100, 32, LAYOUT)
    over = et.simulate(PADDED, H100, 32, LAYOUT.replace(overlap_moe_expert_parallel_comm=True,
                                                          delay_wgrad_compute=True), timeline=True)
    # half or less (the small latency-bound all-to-all of the permuted probs rides with the tokens'); drop-and-pad,
    # so no metadata step: the dropless dispatcher's all-gather of the token counts stays on the compute stream
    assert over.breakdown_s["ep_comm"] <= 0.5 * plain.breakdown_s["ep_comm"] * (1 + 1e-9)
    dropless = et.simulate(MIXTRAL, H100, 32, LAYOUT.replace(overlap_moe_expert_parallel_comm=True,
                                                               delay_wgrad_compute=True))
    assert dropless.breakdown_s["ep_comm"] > over.breakdown_s["ep_comm"]  # the counts' all-gathers, exposed
    assert over.breakdown_s["interference"] > plain.breakdown_s["interference"]
    assert over.step_time_s < plain.step_time_s
    assert sum(over.breakdown_s[p] for p in BREAKDOWN_PARTS) == pytest.approx(over.step_time_s)
    # the trace's MoE dispatch blocks on the critical stage add up to the reduced ep_comm
    crit = over.critical_stage
    drawn = sum(e - s for t, _, c, s, e in over.timeline if t == COMM_TRACK + crit and c == "ep_comm")
    assert drawn == pytest.approx(over.breakdown_s["ep_comm"])


def test_shared_expert_overlap_lowers_ep_comm():
    model = MIXTRAL.replace(moe_shared_expert_intermediate_size=4096)
    plain = et.simulate(model, H100, 32, LAYOUT)
    over = et.simulate(model.replace(moe_shared_expert_overlap=True), H100, 32, LAYOUT)
    assert over.breakdown_s["ep_comm"] < plain.breakdown_s["ep_comm"]
    assert over.breakdown_s["compute"] == pytest.approx(plain.breakdown_s["compute"])


def test_forced_load_balancing_makes_routing_exactly_balanced():
    skewed = MIXTRAL.replace(moe_routing_imbalance=1.5)
    forced = et.simulate(skewed.replace(moe_router_force_load_balancing=True), H100, 32, LAYOUT)
    balanced = et.simulate(MIXTRAL.replace(moe_router_force_load_balancing=True), H100, 32, LAYOUT)
    assert forced.step_time_s == pytest.approx(balanced.step_time_s)
    assert any("forced" in note for note in forced.notes)


def test_flex_dispatcher_with_group_limits_moves_fewer_bytes_across_nodes():
    model = et.load_model("deepseek-v2-lite").replace(num_layers=5, moe_layer_freq=1, seq_length=2048,
                                                      moe_token_dispatcher_type="flex")
    layout = et.ParallelConfig(expert_model_parallel_size=32, global_batch_size=64)
    flex = et.simulate(model, H100, 32, layout)
    limited = et.simulate(model.replace(moe_router_num_groups=4, moe_router_group_topk=1), H100, 32, layout)
    nccl = et.simulate(model.replace(moe_token_dispatcher_type="alltoall"), H100, 32, layout)
    assert limited.breakdown_s["ep_comm"] < flex.breakdown_s["ep_comm"] < nccl.breakdown_s["ep_comm"]
    assert any("deepep" in n for n in flex.notes)
