"""--suggested-communication-unit-size (Megatron-FSDP's pipeline sizes, megatron_fsdp.py at d98e8a64): read, held to
its rules, and said where echo-tune's one-unit-ahead model is an upper bound (issue 39)."""

import pytest

import echo_tune as et
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.errors import ConfigError

LLAMA8 = et.load_model("llama3-8b")
H100 = et.load_cluster("h100-sxm")
FSDP = et.ParallelConfig(global_batch_size=16, use_megatron_fsdp=True, use_distributed_optimizer=True)


def test_the_flag_and_its_rules():
    _, parallel, _, _ = parse_megatron_line("--use-megatron-fsdp --suggested-communication-unit-size 800000000")
    assert parallel["suggested_communication_unit_size"] == 800_000_000
    with pytest.raises(ConfigError, match="is a Megatron-FSDP setting"):
        et.simulate(LLAMA8, H100, 8, FSDP.replace(use_megatron_fsdp=False, suggested_communication_unit_size=10**8))
    with pytest.raises(ConfigError, match="suggested_communication_unit_size > 0"):
        et.simulate(LLAMA8, H100, 8, FSDP.replace(suggested_communication_unit_size=-1))


def test_deeper_prefetch_than_modelled_is_said():
    """Llama-3 8B's layers hold ~218M parameters: the default (>= 1e9 elements, prefetch 5e8) covers ~2.3 layers,
    a size of 4e8 (prefetch 2e8) less than one: only the first gets the note, and the step is the same."""
    deep = et.simulate(LLAMA8, H100, 8, FSDP)
    shallow = et.simulate(LLAMA8, H100, 8, FSDP.replace(suggested_communication_unit_size=400_000_000))
    assert any("prefetches up to 500,000,000 elements" in n for n in deep.notes)
    assert not any("prefetches up to" in n for n in shallow.notes)
    assert shallow.step_time_s == deep.step_time_s
