"""Uneven pipeline stages in the search space: canonical splits per PP, counted and drawn."""

from collections import Counter

import pytest

from echo_tune.search.space.auto_space import auto_space, auto_space_dict
from echo_tune.search.space.layouts import RejectedLayout, draw
from echo_tune.search.space.space_check import check_space
from echo_tune.search.space.search_space import space_from_dict
from echo_tune.search.space.uneven import EVEN, canonical_splits, split_vpp_values


def test_canonical_splits_by_hand():
    # PP dividing the layers: the even split only
    assert canonical_splits(96, 8) == (EVEN,)
    assert canonical_splits(61, 64) == ()  # more stages than layers
    # DeepSeek-V3, 61 layers, PP 8: 63 and 62 do not divide by 8; middle stages ceil(61/8) = 8, so the
    # ends share 61 - 6*8 = 13 (first 7, last 6), or the last stage alone takes 61 - 7*8 = 5
    assert canonical_splits(61, 8) == ((7, 6, False, False), (None, 5, False, False))
    # Llama-3.1 405B, 126 layers, PP 8: (126 + 2) / 8 = 16 -> account for both; the ends' 15/15 split is the same
    # per-stage layers (dropped); last alone 126 - 7*16 = 14
    assert canonical_splits(126, 8) == ((None, None, True, True), (None, 14, False, False))
    # Qwen3-235B, 94 layers, PP 4: (94 + 2) / 4 = 24 -> account for both; 95 % 4 != 0; last alone 94 - 3*24 = 22
    assert canonical_splits(94, 4) == ((None, None, True, True), (None, 22, False, False))
    # 61 layers, PP 2: 62 / 2 = 31 -> account for the loss only (31, 30); the ends' 31/30 split is the same
    assert canonical_splits(61, 2) == ((None, None, False, True),)
    # VPP: account-for-both at PP 8 counts 16 per stage -> 2, 4, 8, 16; last 14 with 16 elsewhere -> 2
    assert split_vpp_values(126, 8) == {2, 4, 8, 16}


def test_the_three_recipe_models_get_pipelines():
    # PP no longer has to divide the layers: every divisor of the GPU count with a canonical split
    for model, layers, pps in (("deepseek-v3", 61, (1, 2, 4, 8, 16)), ("llama3.1-405b", 126, (1, 2, 4, 8, 16, 32, 64)),
                               ("qwen3-235b-a22b", 94, (1, 2, 4, 8, 16, 32))):
        space = auto_space(model, "h100", 1024, 2048)
        assert space.model.num_layers == layers and space.canonical_splits
        assert space.choices["pipeline_model_parallel_size"] == pps


def _llama405b_pipeline_space(**layout):
    data = auto_space_dict("llama3.1-405b", "h100", 1024, 2048)
    data["layout"].update(tensor_model_parallel_size=8, context_parallel_size=[1], micro_batch_size=[1],
                          tp_comm_overlap=False, recompute_granularity="selective", recompute_modules="none",
                          **layout)
    return space_from_dict(data, name="llama405b-pipelines")


def test_space_counts_the_uneven_layouts():
    # Llama-3.1 405B (126 layers), 1024 GPUs, TP 8, everything but the pipeline fixed; M = 2048 / DP = 16 PP, so
    # every interleaving is allowed. (split, VPP) combinations per PP, worked out with canonical_splits above:
    #   PP1 even: 1 | PP2 even 63: VPP none/3/7/9/21/63 = 6
    #   PP4 account-both 32: none/2/4/8/16/32 = 6, last 30 (32 elsewhere): none/2 = 2 -> 8
    #   PP8 account-both 16: none/2/4/8/16 = 5, last 14: none/2 = 2 -> 7
    #   PP16 account-both 8: none/2/4/8 = 4, last 6: none/2 = 2 -> 6
    #   PP32 account-both 4: none/2/4 = 3, last 2: none/2 = 2 -> 5
    #   PP64 account-both 2: none/2 = 2 (ends 1 layer; no last-only split: 126 - 63*2 = 0) -> 2
    valid, _ = check_space(_llama405b_pipeline_space())
    assert len(valid) == 1 + 6 + 8 + 7 + 6 + 5 + 2
    by_pp = Counter(c.parallel.pipeline_model_parallel_size for c in valid)
    assert by_pp == {1: 1, 2: 6, 4: 8, 8: 7, 16: 6, 32: 5, 64: 2}
    uneven = [c for c in valid if c.parallel.pipeline_model_parallel_size > 1 and (
        c.layout.stage_layers[0] != c.layout.stage_layers[1] or c.layout.stage_layers[-1] != c.layout.stage_layers[1])]
    assert {c.layout.stage_layers for c in uneven if c.parallel.pipeline_model_parallel_size == 8} == {
        (15,) + (16,) * 6 + (15,), (16,) * 7 + (14,)}


def test_draw_refuses_a_split_outside_the_canonical_set():
    # at PP 8 the last stage may hold 14 layers or be even (account-for split); 6 is PP 16's last-only value
    space = _llama405b_pipeline_space()
    picks = {"pipeline_model_parallel_size": 8, "decoder_last_pipeline_num_layers": 6,
             "virtual_pipeline_model_parallel_size": None}
    with pytest.raises(RejectedLayout, match="canonical uneven splits"):
        draw(space, lambda name, values: picks.get(name, values[0]))
    picks["decoder_last_pipeline_num_layers"] = 14
    assert draw(space, lambda name, values: picks.get(name, values[0])).layout.stage_layers == (16,) * 7 + (14,)


def test_space_file_lists_split_values():
    # listed values (not auto): every combination goes through check_compatible, no canonical filter
    space = _llama405b_pipeline_space(pipeline_model_parallel_size=[8], decoder_first_pipeline_num_layers=[None, 14],
                                      decoder_last_pipeline_num_layers=[None, 14],
                                      account_for_embedding_in_pipeline_split=[False],
                                      account_for_loss_in_pipeline_split=[False],
                                      virtual_pipeline_model_parallel_size=[None])
    assert not space.canonical_splits
    valid, _ = check_space(space)
    # 126 layers, PP 8: first 14 -> (126 - 14) / 7 = 16; last 14 likewise; both 14 -> 98 / 6 not whole; none:
    # 126 % 8 != 0
    assert sorted(c.layout.stage_layers for c in valid) == [(14,) + (16,) * 7, (16,) * 7 + (14,)]
