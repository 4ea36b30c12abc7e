"""The recipe features as search dimensions (search/space/features.py, feature_values.py, feature_variants.py,
pipeline_layouts.py, recipe_defaults.py)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from echo_tune.config.specs.pipeline_layout import parse_layout
from echo_tune.errors import ConfigError
from echo_tune.search.space.auto_space import auto_space, layout_overrides
from echo_tune.search.engines.feature_variants import core_space, variants
from echo_tune.search.space.layouts import RejectedLayout, draw
from echo_tune.search.engines.objective import evaluate
from echo_tune.search.space.pipeline_layouts import balanced_layouts
from echo_tune.search.space.recipe_defaults import ALWAYS_ON
from echo_tune.search.outputs.results import megatron_flags

DEEPSEEK_RECIPE = {  # runs_bridge.csv mb2509-deepseek-v3-fp8-1024xh100 (Megatron-Bridge@v0.1.0rc4 run_script.py)
    "num_gpus": 1024, "tensor_model_parallel_size": 2, "pipeline_model_parallel_size": 8,
    "context_parallel_size": 1, "expert_model_parallel_size": 64, "expert_tensor_parallel_size": 1,
    "pipeline_model_parallel_layout": "Et|(tt|)*30mL", "micro_batch_size": 1, "recompute_granularity": "selective",
    "recompute_modules": "mla_up_proj mlp", "fp8_format": "hybrid", "fp8_recipe": "tensorwise",
    "moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "deepep",
    "overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True}


def _chooser(config: dict):
    def choose(name, values):
        if name in config:
            assert config[name] in values, (name, config[name], values)
            return config[name]
        return values[0]
    return choose


@pytest.fixture(scope="module")
def deepseek_space():
    return auto_space("deepseek-v3", "h100", 1024, 8192, seq_length=4096, fp8_format="auto",
                      layout={"pipeline_model_parallel_layout": "auto"})


def test_balanced_layouts_include_the_deepseek_recipe_and_balance_every_chunk():
    layouts = balanced_layouts(61, 1)
    assert "Et|(tt|)*30mL" in layouts  # Megatron-Bridge's DeepSeek-V3 H100 layout, written with '|'
    for text in balanced_layouts(61, 1, every_counting=True):
        chunks = parse_layout(text)
        flat = [c for chunk in chunks for c in chunk]
        assert flat.count("t") == 61 and flat.count("m") == 1 and flat[0] == "E" and flat[-1] == "L"
        assert chunks[-1][-2:] == ["m", "L"]
    for text in layouts:  # embedding, MTP and loss counted as a layer each: every chunk the same slots
        assert len({len(chunk) for chunk in parse_layout(text)}) == 1


def test_the_zero_yaml_space_holds_nvidias_deepseek_recipe(deepseek_space):
    assert deepseek_space.choices["moe_token_dispatcher_type"] == ("alltoall", "flex")
    assert deepseek_space.choices["moe_flex_dispatcher_backend"] == ("deepep", "hybridep")
    assert deepseek_space.choices["fp8_recipe"] == ("delayed", "tensorwise")
    assert "mla_up_proj mlp" in deepseek_space.choices["recompute_modules"]
    candidate = draw(deepseek_space, _chooser(DEEPSEEK_RECIPE))
    assert candidate.model.moe_token_dispatcher_type == "flex"
    assert candidate.parallel.recompute_modules == ("mla_up_proj", "mlp")
    assert candidate.parallel.overlap_param_gather_with_optimizer_step  # set on where it applies
    flags = " ".join(megatron_flags(deepseek_space, {"config": candidate.config}))
    assert "hybridep" not in flags  # deepep: Megatron's default backend, not written
    for flag in ("--moe-token-dispatcher-type flex",
                 "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute", "--recompute-modules mla_up_proj mlp",
                 "--overlap-param-gather-with-optimizer-step"):
        assert flag in flags


def test_no_flex_dispatcher_where_the_gpu_cannot_run_it():
    space = auto_space("qwen3-30b-a3b", "a100-80gb", 16, 512, seq_length=4096)
    assert space.choices["moe_token_dispatcher_type"] == ("alltoall",)


def test_variants_toggle_every_feature_and_keep_the_rest(deepseek_space):
    base = draw(core_space(deepseek_space), _chooser(DEEPSEEK_RECIPE))
    found = variants(deepseek_space, base)
    keys = [c.key for c in found]
    assert len(keys) == len(set(keys)) and base.key in keys
    assert {c.model.moe_flex_dispatcher_backend for c in found if c.model.moe_token_dispatcher_type == "flex"} == \
        {"deepep", "hybridep"}
    assert {c.parallel.overlap_moe_expert_parallel_comm for c in found} == {False, True}
    assert {c.parallel.fp8_recipe for c in found} == {"delayed", "tensorwise"}
    for c in found:  # only the features differ
        p = c.parallel
        assert (p.tensor_model_parallel_size, p.micro_batch_size, p.pipeline_model_parallel_layout) == \
            (2, 1, "Et|(tt|)*30mL")


def test_layout_option_takes_module_sets_and_refuses_unknown_modules():
    assert layout_overrides(["recompute_modules=mla_up_proj+mlp,moe_act"]) == \
        {"recompute_modules": ["mla_up_proj+mlp", "moe_act"]}
    space = auto_space("qwen3-30b-a3b", "h100", 16, 512, seq_length=4096,
                       layout=layout_overrides(["recompute_modules=moe_act,layernorm+moe_act"]))
    assert space.choices["recompute_modules"] == ("moe_act", "layernorm moe_act")
    with pytest.raises(ConfigError, match="recompute_modules"):
        auto_space("qwen3-30b-a3b", "h100", 16, 512, seq_length=4096,
                   layout=layout_overrides(["recompute_modules=attention_please"]))


def test_features_set_on_are_never_slower_and_never_heavier():
    """recipe_defaults.ALWAYS_ON: each feature, where it applies, simulated off and on for layouts of two MoE spaces
    (both dispatchers, EP overlap off and on): on never takes longer nor more memory (the dominance the zero-YAML
    space relies on to list on alone)."""
    cases = [(auto_space("qwen3-30b-a3b", "h100", 16, 512, seq_length=4096, fp8_format="auto"),
              {"num_gpus": 16, "pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 12,
               "expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1, "micro_batch_size": 2,
               "fp8_format": "hybrid", "fp8_recipe": "tensorwise"}),
             (auto_space("deepseek-v3", "h100", 1024, 8192, seq_length=4096, fp8_format="auto",
                         layout={"pipeline_model_parallel_layout": "auto"}), DEEPSEEK_RECIPE)]
    checked = 0
    for space, base in cases:
        both = dataclasses.replace(space, choices={**space.choices, **{f: (False, True) for f in ALWAYS_ON}})
        for dispatcher, overlap in itertools.product(("alltoall", "flex"), (False, True)):
            config = {**base, "moe_token_dispatcher_type": dispatcher, "overlap_moe_expert_parallel_comm": overlap}
            for feature in ALWAYS_ON:
                try:
                    off, on = (draw(both, _chooser({**config, **{f: True for f in ALWAYS_ON}, feature: value}))
                               for value in (False, True))
                except RejectedLayout:
                    continue
                if off.key == on.key:  # the feature does not apply to this layout
                    continue
                off_record, on_record = evaluate(both, off)[0], evaluate(both, on)[0]
                assert on_record["step_time_s"] <= off_record["step_time_s"] + 1e-9, (feature, config)
                assert on_record["peak_memory_bytes"] <= off_record["peak_memory_bytes"], (feature, config)
                checked += 1
    assert checked >= 12


def test_cuda_graph_impl_none_is_its_own_word_and_layouts_are_listed_per_pipeline():
    space = auto_space("qwen3-30b-a3b", "h100", 16, 512, seq_length=4096,
                       layout=layout_overrides(["cuda_graph_impl=none,transformer_engine",
                                                "pipeline_model_parallel_layout=auto"]))
    assert space.choices["cuda_graph_impl"] == ("none", "transformer_engine")
    assert space.choices["cuda_graph_modules"] == ("attn", "attn moe_router moe_preprocess")
    assert space.generated_layouts and space.choices["pipeline_model_parallel_layout"][0] is None
    graphed = draw(space, _chooser({"num_gpus": 16, "expert_model_parallel_size": 8,
                                    "cuda_graph_impl": "transformer_engine",
                                    "cuda_graph_modules": "attn moe_router moe_preprocess"}))
    assert graphed.parallel.cuda_graph_impl == "transformer_engine"
    assert graphed.parallel.cuda_graph_modules == ("attn", "moe_router", "moe_preprocess")
    # 48 layers + embedding + loss = 50 slots: 10 chunks of 5 at PP 2 (VPP 5), set by the layout, no uneven split
    assert "Et*4|(t*5|)*8t*4L" in space.choices["pipeline_model_parallel_layout"]
    layout = "Et*4|(t*5|)*8t*4L"
    c = draw(space, _chooser({"num_gpus": 16, "pipeline_model_parallel_size": 2,
                              "pipeline_model_parallel_layout": layout}))
    p = c.parallel
    assert p.pipeline_model_parallel_layout == layout and p.virtual_pipeline_model_parallel_size is None
    assert p.decoder_first_pipeline_num_layers is None and not p.account_for_embedding_in_pipeline_split


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b", "llama3.1-70b"])
def test_generated_recompute_module_sets_are_distinct_as_sets(model):
    """Megatron takes ``--recompute-modules`` as a set: "layernorm moe_act" and "moe_act layernorm" are one setting,
    so a generated space lists it once (an all-MoE model listed both, each layout twice)."""
    from echo_tune.config.load.loading import load_cluster, load_model
    from echo_tune.search.space.feature_values import FEATURE_AUTO

    sets = [s for s in FEATURE_AUTO["recompute_modules"](load_model(model), load_cluster("h100")) if s]
    assert len({frozenset(s.split()) for s in sets}) == len(sets)
    if load_model(model).is_moe:  # the fullest set is still there: what recompute saves most with
        assert any({"moe_act", "layernorm"} <= set(s.split()) for s in sets)
