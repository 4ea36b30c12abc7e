"""--pipeline-model-parallel-layout: parsed and validated as Megatron-LM d98e8a64ddf3 does
(megatron/core/transformer/pipeline_parallel_layer_layout.py), and the stage contents it gives."""

import pytest

import echo_tune as et
from echo_tune.config.rules.compatibility import check_compatible
from echo_tune.config.specs.pipeline_layout import layout_contents, parse_layout
from echo_tune.config.rules.stage_split import split_stages
from echo_tune.errors import ConfigError

DSV3 = et.load_model("deepseek-v3")  # 61 layers, 1 MTP layer
H100 = et.load_cluster("h100")
DSV3_LAYOUT = "Et|(tt|)*30mL"  # runs_bridge.csv DeepSeek-V3 row (Megatron-Bridge writes Et/(tt/)*30mL)


def test_parse_unrolls_and_drops_commas():
    # parse_str_to_list's own docstring example: "Ettt|(tt|)*29,m|L" -> [E t t t] + [t t]*29 + [m] + [L]
    stages = parse_layout("Ettt|(tt|)*29,m|L")
    assert stages == [list("Ettt")] + [list("tt")] * 29 + [["m"], ["L"]]
    assert parse_layout("E|t*3|L") == [["E"], ["t", "t", "t"], ["L"]]
    # "(tt|)*2" unrolls to "tt|tt|", so the L stands alone in a last stage
    assert parse_layout("Et/(tt/)*2L") == parse_layout("Et|(tt|)*2L") == [list("Et"), list("tt"), list("tt"), ["L"]]


def test_deepseek_v3_recipe_layout_pp8_vp4():
    # 32 entries listed chunk-major: entry c*8 + s is chunk c of stage s. Entry 0 = "Et", entries 1..30 = "tt",
    # entry 31 = "mL". So stage 0 holds Et, tt, tt, tt (7 layers + embedding); stage 7 holds tt, tt, tt, mL
    # (6 layers + MTP + loss); stages 1-6 hold 4 x tt (8 layers). 7 + 6*8 + 6 = 61 decoder layers.
    contents = layout_contents(DSV3_LAYOUT, 8, 61, 1)
    assert len(contents) == 8 and all(len(row) == 4 for row in contents)
    layers = [[c.layers for c in row] for row in contents]
    assert layers[0] == [1, 2, 2, 2] and layers[7] == [2, 2, 2, 0]
    assert all(row == [2, 2, 2, 2] for row in layers[1:7])
    assert sum(map(sum, layers)) == 61
    holders = {(s, c): (x.embedding, x.loss, x.mtp_layers) for s, row in enumerate(contents)
               for c, x in enumerate(row) if x.embedding or x.loss or x.mtp_layers}
    assert holders == {(0, 0): (True, False, 0), (7, 3): (False, True, 1)}
    # chunk-major layer numbering: chunk 0 of stage 0 holds layer 0, chunk 0 of stage 1 layers 1-2, ...,
    # chunk 1 of stage 0 starts after chunk 0 of all 8 stages: 1 + 7 * 2 = 15
    assert contents[0][0].first_layer == 0 and contents[1][0].first_layer == 1
    assert contents[0][1].first_layer == 15 and contents[7][3].first_layer == 61


def test_layout_sets_vpp_and_the_schedule():
    parallel = et.ParallelConfig(tensor_model_parallel_size=2, pipeline_model_parallel_size=8,
                                 expert_model_parallel_size=64, sequence_parallel=True, global_batch_size=8192,
                                 pipeline_model_parallel_layout="Et/(tt/)*30mL")
    assert parallel.pipeline_model_parallel_layout == DSV3_LAYOUT  # stored as Megatron reads it
    layout = check_compatible(DSV3, H100, 1024, parallel)
    assert layout.virtual_pipeline_size == 4 and layout.schedule == "interleaved"
    assert layout.stage_layers == (7, 8, 8, 8, 8, 8, 8, 6)
    assert layout.holder("embedding") == (0, 0) and layout.holder("loss") == (7, 3)
    # a VPP given beside the layout must be the layout's (transformer_config.py)
    check_compatible(DSV3, H100, 1024, parallel.replace(virtual_pipeline_model_parallel_size=4))
    with pytest.raises(ConfigError, match="virtual_pipeline_model_parallel_size == stages in the layout"):
        check_compatible(DSV3, H100, 1024, parallel.replace(virtual_pipeline_model_parallel_size=2))


@pytest.mark.parametrize("text, stage_layers, mtp_at", [
    # Megatron's own test layouts (tests/unit_tests/pipeline_parallel/test_pipeline_layout.py): 8 layers,
    # 1 MTP layer, PP4 VP2. Entries 0..7 listed chunk-major; stage s holds entries s and 4 + s.
    # entries E, ttt, t, t, t, t, t, mL -> stages E+t, ttt+t, t+t, t+mL
    ("E|t*3|(t|)*5mL", (1, 4, 2, 1), (3, 1)),
    # entries E, ttt, t, t, t, t, tm, L -> stages E+t, ttt+t, t+tm, t+L: MTP on stage 2 ("standalone")
    ("E|t*3|(t|)*4tm|L", (1, 4, 2, 1), (2, 1)),
    # entries E, ttt, t, t, t, tt, m, L -> stages E+t, ttt+tt, t+m, t+L
    ("E|t*3|(t|)*3tt|m|L", (1, 5, 1, 1), (2, 1)),
])
def test_megatron_unit_test_layouts(text, stage_layers, mtp_at):
    contents = layout_contents(text, 4, 8, 1)
    assert tuple(sum(c.layers for c in row) for row in contents) == stage_layers
    assert [(s, c) for s, row in enumerate(contents) for c, x in enumerate(row) if x.mtp_layers] == [mtp_at]
    assert contents[0][0].embedding and contents[3][1].loss


@pytest.mark.parametrize("text, pp, fragment", [
    ("Et|tt|ttL", 2, "len(pipeline_model_parallel_layout) % pipeline_model_parallel_size == 0"),
    ("tE|L", 2, "the first layer is the embedding E"),
    ("E|tL|t", 3, "the last layer is the loss L"),
    ("EE|L", 2, "E appears exactly once"),
    ("E|tt|L", 3, "number of t == num_layers"),
    ("Ex|L", 2, "may only use the layer characters"),
    ("Emt|L", 2, "decoder layers t come before the MTP layers m"),
])
def test_layout_errors_are_one_line(text, pp, fragment):
    with pytest.raises(ConfigError) as err:
        layout_contents(text, pp, 1 if fragment != "number of t == num_layers" else 3,
                        1 if "MTP" in fragment else None)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_mtp_rules():
    # MTP only in a stage's last chunk: PP2 VP2, entries E, t, m, tL -> stage 0 holds E + m (m in its last
    # chunk, allowed), stage 1 holds t + tL; but the m comes before a t in layer order
    with pytest.raises(ConfigError, match="decoder layers t come before"):
        layout_contents("E|t|m|tL", 2, 2, 1)
    # PP1 with 3 chunks Et, m, L: the m sits after every t but in chunk 1 of 3, not the stage's last chunk
    with pytest.raises(ConfigError, match="MTP layers sit in a stage's last virtual chunk"):
        layout_contents("Et|m|L", 1, 1, 1)
    # PP2 VP2, entries Et, t, m, L: the m is in stage 0's last chunk, after every t: allowed ("standalone")
    assert layout_contents("Et|t|m|L", 2, 2, 1)[0][1].mtp_layers == 1
    with pytest.raises(ConfigError, match="number of m == mtp_num_layers"):
        layout_contents("Et|tmL", 2, 2, None)


def test_layout_refuses_the_other_split_settings():
    base = et.ParallelConfig(pipeline_model_parallel_size=8, tensor_model_parallel_size=2, global_batch_size=8192,
                             expert_model_parallel_size=64, sequence_parallel=True,
                             pipeline_model_parallel_layout=DSV3_LAYOUT)
    for extra in (dict(decoder_first_pipeline_num_layers=7), dict(account_for_loss_in_pipeline_split=True),
                  dict(num_layers_per_virtual_pipeline_stage=2)):
        with pytest.raises(ConfigError, match="cannot be combined with other pipeline split settings"):
            split_stages(DSV3, base.replace(**extra))


def test_account_for_split_equals_its_layout():
    # GPT-3 175B (96 layers), PP 14 would not divide; account-for both: (96 + 2) / 14 = 7 per stage, the ends 6.
    # The same split as a layout: E + 6t, then 12 stages of 7t, then 6t + L.
    gpt3 = et.load_model("gpt3-175b")
    flags = et.ParallelConfig(pipeline_model_parallel_size=14, global_batch_size=14,
                              account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    layout = et.ParallelConfig(pipeline_model_parallel_size=14, global_batch_size=14,
                               pipeline_model_parallel_layout="Et*6|(t*7|)*12t*6L")
    assert split_stages(gpt3, flags) == split_stages(gpt3, layout)
    assert [row[0].layers for row in split_stages(gpt3, flags)] == [6] + [7] * 12 + [6]
