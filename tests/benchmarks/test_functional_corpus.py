"""benchmarks/functional_corpus.py and functional_cases.py: the corpus, its summaries, the launch lines."""

import shlex

from functional_cases import corpus_runs, gpus_for, launch_line, load_corpus, out_of_scope
from functional_corpus import golden_summary, steady_iteration_steps


def test_steady_window_is_megatrons():
    # common.py at d98e8a64ddf3: range(5, 21) when the last finite step <= 25, else range(30, 46)
    assert steady_iteration_steps([1, 5, 10, 15, 20, 25]) == [5, 10, 15, 20]
    assert steady_iteration_steps(list(range(1, 51))) == list(range(30, 46))
    assert steady_iteration_steps([1, 2, 3, 26, 27, 28, 29, 50, 60]) == [50, 60]  # nothing in 30..45
    assert steady_iteration_steps([]) == []


def test_golden_summary_of_a_raw_golden_file():
    # gpt3_7b_tp1_pp4_memory_speed/golden_values_dev_dgx_a100.json (Megatron-LM d98e8a64ddf3), abridged
    raw = {"iteration-time": {"start_step": 1, "end_step": 25, "step_interval": 5,
                              "values": {"1": "nan", "5": "nan", "10": 2.9368, "15": "nan", "20": 2.94791,
                                         "25": "nan"}},
           "mem-allocated-bytes": {"values": {"1": 24510808064.0, "5": 24510808064.0, "20": 24511029248.0}},
           "mem-max-allocated-bytes": {"values": {"1": 52700401664.0, "5": 60489064448.0}}}
    out = golden_summary(raw)
    assert out["iteration_time_s_median"] == round((2.9368 + 2.94791) / 2, 6)  # steps 10 and 20 only
    assert out["iteration_time_steps"] == [10, 20, 2]
    assert out["mem_allocated_bytes_first"] == 24510808064 and out["mem_allocated_bytes_max"] == 24511029248
    assert out["mem_max_allocated_bytes_first"] == 52700401664 and out["mem_max_allocated_bytes_max"] == 60489064448


def test_launch_line_follows_megatrons_ci():
    line = launch_line({"--a": True, "--b": False, "--c": 3, "--d": "[x y]", "--e": [1, 2], "--f": "${P}/x",
                        "--g": "", "--h": "([1]*3)"})
    assert shlex.split(line) == ["--a", "--c", "3", "--d", "x", "y", "--e", "1", "2", "--f", "${P}/x",
                                 "--h", "([1]*3)"]


def test_corpus_is_complete_and_matched_to_recipes():
    corpus = load_corpus()
    assert {name: len(c["cases"]) for name, c in corpus.items()} == {"gpt": 206, "moe": 65}
    assert all(c["source_commit"].startswith("d98e8a64ddf3") for c in corpus.values())
    case = corpus["gpt"]["cases"]["gpt3_7b_tp1_pp4_memory_speed"]
    assert case["model_args"]["--pipeline-model-parallel-size"] == 4
    defaults = corpus["gpt"]["default_recipes"]
    # h100/gpt.yaml: 1 node x 8 GPUs; gb200/gpt.yaml: 2 nodes x 4 GPUs
    assert gpus_for(case, defaults, "dgx_h100") == (8, "recipe: h100/gpt.yaml")
    assert gpus_for(case, defaults, "dgx_gb200") == (8, "recipe: gb200/gpt.yaml")
    assert gpus_for({"recipes": []}, defaults, "dgxa100_dracooci")[0] == 8


def test_out_of_scope_cases_are_counted_apart():
    assert out_of_scope("gpt_dynamic_inference_tp1_pp1_583m_logitsmatch") == "inference"
    assert out_of_scope("gpt_grpo_basic_function") == "rl"
    assert out_of_scope("gpt3_mcore_te_tp2_pp2") is None
    runs, left_out = corpus_runs()
    assert len(runs) + sum(map(len, left_out.values())) == 206 + 65
    first = runs["gpt/gpt3_7b_tp1_pp4_memory_speed"]
    assert [r.cluster for r in first] == ["h100-sxm", "a100-80gb", "gb200-nvl72"]  # primary platform first


def test_a_case_that_states_its_gpus_runs_on_them():
    # gpt3_mcore_reruns_resume_check_grads/model_config.yaml: MODEL_ENV_VARS.MODEL_ARGS.GPUS_PER_NODE: 1
    # ("DP=1, TP=1, CP=1, PP=1"), though its recipe h100/gpt-grads.yaml books a node of 8
    from functional_cases import gpus_for, load_corpus
    gpt = load_corpus()["gpt"]
    case = gpt["cases"]["gpt3_mcore_reruns_resume_check_grads"]
    assert gpus_for(case, gpt["default_recipes"], "dgx_h100")[0] == 1
    other = gpt["cases"]["gpt3_mcore_te_tp2_pp2"]
    assert "model_args_gpus_per_node" not in other and gpus_for(other, gpt["default_recipes"], "dgx_h100")[0] == 8
