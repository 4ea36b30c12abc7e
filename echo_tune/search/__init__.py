"""Search Megatron layouts with the simulator as the objective (``echo-tune search``; ranking candidates,
``echo-tune rank``, is ``echo_tune.plan.rank``).

    from echo_tune.search import load_space, run_search, SearchOptions
    space = load_space("search_spaces/gpt3-175b-96xh800.yaml")
    result = run_search(space, SearchOptions(sampler="tpe", n_trials=200))
    result.best["step_time_s"], result.best["config"]
"""

from echo_tune.search.space.layouts import Candidate, RejectedLayout, draw, enumerate_layouts
from echo_tune.search.space.baselines import baselines
from echo_tune.search.space.space_check import check_space
from echo_tune.search.space.params import full_params, layout_of, search_distributions, suggest_layout
from echo_tune.search.engines.objective import OBJECTIVE_KEYS, Evaluator, evaluate
from echo_tune.search.engines.sampler import SAMPLERS, ValidLayoutSampler, register_sampler
from echo_tune.search.space.search_space import FIELD_ORDER, OBJECTIVES, SearchSpace, load_space, space_from_dict
from echo_tune.search.study import SearchOptions, SearchResult, run_search

__all__ = ["FIELD_ORDER", "OBJECTIVES", "OBJECTIVE_KEYS", "SAMPLERS", "Candidate", "Evaluator", "RejectedLayout",
           "SearchOptions", "SearchResult", "SearchSpace", "ValidLayoutSampler", "baselines", "check_space", "draw",
           "enumerate_layouts", "evaluate", "full_params", "layout_of", "load_space",
           "register_sampler", "run_search", "search_distributions", "space_from_dict", "suggest_layout"]
