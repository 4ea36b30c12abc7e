"""The MoE assumptions a report states (sim/schedule/layer_mix.py moe_notes)."""

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.sim.schedule.layer_mix import LEARNED_ROUTER_LOAD, moe_notes

H100 = et.load_cluster("h100-sxm")
MODEL = et.load_model("qwen3-30b-a3b")
PARALLEL = et.ParallelConfig(expert_model_parallel_size=16, global_batch_size=64)


def _routing_note(model):
    return moe_notes(model, check_compatible(model, H100, 16, PARALLEL), "h100-sxm")[0]


def test_a_learned_router_note_gives_the_measured_skew_to_set():
    note = _routing_note(MODEL.replace(moe_router_force_load_balancing=False))
    assert note.startswith("MoE routing assumed balanced") and LEARNED_ROUTER_LOAD in note
    assert "1.7-2.0x" in note and "issue 7668" in note


def test_forced_or_stated_routing_needs_no_reference():
    forced = _routing_note(MODEL.replace(moe_router_force_load_balancing=True))
    skewed = _routing_note(MODEL.replace(moe_router_force_load_balancing=False, moe_routing_imbalance=1.5))
    assert LEARNED_ROUTER_LOAD not in forced and LEARNED_ROUTER_LOAD not in skewed
    assert "forced" in forced and "busiest expert x1.5" in skewed
