"""The sliced route's bound on the valid layouts (``sliced.option_leaves``): the complete layouts the enumeration
checks, so never below the valid ones; a space whose product of values passes MAX_VALID_LAYOUTS is sliced when
that count does not."""

from __future__ import annotations

import math

import pytest

from echo_tune.search.engines import sliced
from echo_tune.search.space.auto_space import auto_space
from echo_tune.search.space import layouts
from echo_tune.search.space.layouts import SHAPE_FIELDS, shape_prefixes
from echo_tune.search.space.space_check import check_space
from echo_tune.search.space.search_space import FIELD_ORDER


@pytest.mark.parametrize("name", ["small", "moe"])
def test_the_count_is_the_layouts_the_enumeration_checks(name, small_space, monkeypatch):
    space = small_space if name == "small" else auto_space(
        model="mixtral-8x7b", cluster="h100", num_gpus=16, global_batch_size=64,
        layout={"recompute_modules": "none", "moe_flex_dispatcher_backend": "deepep", "delay_wgrad_compute": True})
    checked = [0]
    candidate = layouts._candidate

    def counted(*args):
        checked[0] += 1
        return candidate(*args)
    monkeypatch.setattr(layouts, "_candidate", counted)
    valid = check_space(space)[0]
    shapes = list(shape_prefixes(space))
    leaves = sliced.option_leaves(space, shapes, 10**9)
    assert leaves == checked[0] >= len(valid) > 0
    product = len(shapes) * math.prod(len(space.choices[f]) for f in FIELD_ORDER[len(SHAPE_FIELDS):])
    assert leaves <= product
    assert sliced.option_leaves(space, shapes, 10) > 10  # stops once past the limit


def test_a_space_within_the_count_is_sliced_one_past_it_is_not(small_space, monkeypatch):
    shapes = list(shape_prefixes(small_space))
    leaves = sliced.option_leaves(small_space, shapes, 10**9)
    product = len(shapes) * math.prod(len(small_space.choices[f]) for f in FIELD_ORDER[len(SHAPE_FIELDS):])
    assert leaves < product  # the limit below lies between them: the product alone would not slice
    monkeypatch.setattr(sliced, "MAX_VALID_LAYOUTS", leaves)
    assert sliced.shapes_to_slice(small_space, n_jobs=2, every_layout=True, shared=False) == shapes
    monkeypatch.setattr(sliced, "MAX_VALID_LAYOUTS", leaves - 1)
    assert sliced.shapes_to_slice(small_space, n_jobs=2, every_layout=True, shared=False) is None
