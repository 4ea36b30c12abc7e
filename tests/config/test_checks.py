"""The small validators: NaN and infinity never pass a `> 0` check."""

import math

import pytest

from echo_tune.config._checks import require_positive
from echo_tune.errors import ConfigError


@pytest.mark.parametrize("value", [0, -1, -0.5, math.nan, math.inf, -math.inf, True, "8", None])
def test_require_positive_refuses(value):
    with pytest.raises(ConfigError, match=r"^`x > 0` must hold, but got \(x="):
        require_positive("x", value)


@pytest.mark.parametrize("value", [1, 0.5, 1e30])
def test_require_positive_accepts(value):
    require_positive("x", value)


def test_to_dict_is_a_fresh_dict_each_call_and_not_pickled_with_its_cache():
    import pickle

    import echo_tune as et

    p = et.ParallelConfig(tensor_model_parallel_size=2, global_batch_size=8, recompute_granularity="selective",
                          recompute_modules=("core_attn", "mlp"))
    first = p.to_dict()
    first["tensor_model_parallel_size"] = 5
    assert p.to_dict()["tensor_model_parallel_size"] == 2 and p.to_dict()["recompute_modules"] == ("core_attn", "mlp")
    back = pickle.loads(pickle.dumps(p))
    assert back == p and hash(back) == hash(p) and "_as_dict" not in back.__dict__
    assert p.replace(micro_batch_size=2).to_dict()["micro_batch_size"] == 2
