"""Every Megatron-LM flag at d98e8a64ddf3 is classified exactly once; nothing else is listed; an unknown flag
is named as not a Megatron-LM flag, with the closest real one."""

from __future__ import annotations

import pytest

from echo_tune.config.flags import unmodelled
from echo_tune.config.flags.flag_catalog import catalog, closest, megatron_flags, spelling
from echo_tune.config.launch.megatron_args import parse_megatron_line
from echo_tune.config.flags.unmodelled import LEGACY, UnmodelledError, classes_of, modelled_flags, refusal, unclassified


def listed() -> set[str]:
    groups = (*unmodelled.HARMLESS.values(), *unmodelled.STEP_SHAPING.values(), *unmodelled.OUT_OF_SCOPE.values())
    return set().union(*groups) | set(unmodelled.VALUE_RULES)


def test_the_list_is_megatron_at_the_reference_commit():
    assert catalog()["commit"].startswith("d98e8a64ddf3")
    flags = megatron_flags()
    assert len(flags) > 800  # arguments.py at d98e8a64ddf3: ~400 add_argument calls + ~460 dataclass flags
    # a dataclass bool defaulting to True gets --no- and --disable- (argument_utils.py ArgumentGroupFactory)
    assert flags["--no-tp-comm-bulk-wgrad"]["dest"] == "tp_comm_bulk_wgrad"
    assert flags["--disable-tp-comm-bulk-wgrad"]["action"] == "store_false"
    assert flags["--moe-router-fusion"] == {**flags["--moe-router-fusion"], "takes_value": False,
                                            "action": "store_true"}
    assert flags["--optimizer"]["takes_value"] and "muon" in flags["--optimizer"]["choices"]


def test_every_megatron_flag_is_in_exactly_one_class():
    assert unclassified(megatron_flags()) == []
    # the check can fail: a flag in no class is reported, and so is one listed twice
    assert unclassified([*megatron_flags(), "--made-up-flag"]) == ["--made-up-flag"]
    assert classes_of("--num-layers") == [("modelled", "config/launch/megatron_args.py")]
    assert [c for c, _ in classes_of("--seed")] == ["harmless"]


def test_no_listed_flag_is_missing_from_megatron_except_kept_legacy_spellings():
    known = set(megatron_flags())
    stale = sorted((listed() | modelled_flags()) - known - set(LEGACY))
    assert stale == []
    assert not set(LEGACY) & known  # a legacy spelling is one Megatron no longer defines...
    assert all(reason for reason in LEGACY.values())  # ...kept for a stated reason
    assert unclassified(LEGACY) == []  # and it is classified like any other


def test_value_rules_name_real_choices():
    for flag, values in unmodelled.VALUE_RULES.items():
        choices = megatron_flags()[flag].get("choices")
        assert choices is None or set(values) <= {str(c) for c in choices}, flag


@pytest.mark.parametrize("flag", ["--overlap-param-gather-with-optimizer-step", "--moe-router-fusion"])
def test_flags_once_called_unknown_are_modelled(flag):
    assert classes_of(flag) == [("modelled", "config/launch/megatron_args.py")]


def test_an_invented_flag_is_not_a_megatron_flag():
    with pytest.raises(UnmodelledError, match=r"`--invented-flag` is not a Megatron-LM flag at d98e8a64ddf3; "
                                              r"remove it or check its spelling$"):
        parse_megatron_line("--num-layers 2 --invented-flag 3")
    assert "did you mean `--overlap-grad-reduce`?" in refusal("--overlap-grad-reduse")
    assert closest("--zzzz-qqqq") is None


def test_spellings_match_argparse_first_then_underscores():
    assert spelling("--use-checkpoint-opt_param-scheduler") == "--use-checkpoint-opt_param-scheduler"
    assert spelling("--seq_length") == "--seq-length"
    model, _, _, ignored = parse_megatron_line("--seq_length 8 --use-checkpoint-opt_param-scheduler")
    assert model == {"seq_length": 8} and ignored == ["--use-checkpoint-opt_param-scheduler"]


@pytest.mark.parametrize("flag, values, words", [
    ("--perform-rl-step", (), "RL training, which is out of scope"),
    ("--fp4-param-gather", (), "FP4"),
    ("--muon-use-syrk", (), "Newton-Schulz kernel variant"),
    ("--rerun-mode", ("report_stats",), "re-runs steps"),
    ("--hybrid-layer-pattern", ("M*-",), "Mamba"),
])
def test_refused_by_name_with_the_reason(flag, values, words):
    reason = refusal(flag, values)
    assert reason is not None and flag in reason and words in reason


@pytest.mark.parametrize("flag, values", [("--optimizer", ("adam",)), ("--rerun-mode", ("disabled",)),
                                          ("--max-tokens-to-oom", ("12000",)), ("--timing-log-option", ("max",)),
                                          ("--dist-ckpt-optim-fully-reshardable", ())])
def test_modelled_values_and_harmless_flags_pass(flag, values):
    assert refusal(flag, values) is None
