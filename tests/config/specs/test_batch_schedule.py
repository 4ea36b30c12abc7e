"""--step-batch-size-schedule without --global-batch-size: the steady-state (final) global batch."""

from __future__ import annotations

import pytest

from echo_tune.config.specs.batch_schedule import final_global_batch_size
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.errors import ConfigError

# Megatron-LM's functional test gpt3_15b_8t_release (model_config.yaml): tokens 0 -> 384, 200B -> 768, 400B -> 1152
LINE = "--num-layers 2 --micro-batch-size 4 --step-batch-size-schedule '0:384 200B:768 400B:1152'"


def test_the_last_threshold_sets_the_batch():
    assert final_global_batch_size("0:384 200B:768 400B:1152") == 1152
    assert final_global_batch_size("400B:1152,0:384 200B:768") == 1152  # Megatron sorts by threshold
    assert final_global_batch_size("0:1K") == 1000  # suffixes as num_microbatches_calculator.py reads them


def test_a_megatron_line_takes_the_final_batch_and_says_so():
    _, parallel, _, ignored = parse_megatron_line(LINE)
    assert parallel["global_batch_size"] == 1152
    assert any("--step-batch-size-schedule" in note and "1152" in note for note in ignored)
    unquoted = LINE.replace("'", "")  # the pairs as separate tokens, up to the next flag
    assert parse_megatron_line(unquoted)[1]["global_batch_size"] == 1152


def test_bad_schedules_are_refused():
    with pytest.raises(ConfigError, match="cannot both be given"):
        parse_megatron_line(LINE + " --global-batch-size 64")
    with pytest.raises(ConfigError, match="THRESHOLD:BATCH_SIZE"):
        final_global_batch_size("0-384")
    with pytest.raises(ConfigError, match="THRESHOLD:BATCH_SIZE"):
        final_global_batch_size("0:many")
