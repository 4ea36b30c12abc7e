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
