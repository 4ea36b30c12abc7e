"""Every flag of every command has a help line; text settings show their allowed values."""

import argparse

from echo_tune.cli.main import build_parser


def _walk(parser, prefix, out):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                _walk(sub, prefix + [name], out)
        elif action.option_strings and action.dest != "help":
            out.append((" ".join(prefix), action))


def test_every_flag_has_help():
    actions = []
    _walk(build_parser(), [], actions)
    missing = [(cmd, a.option_strings) for cmd, a in actions if not a.help]
    assert not missing
    assert len({cmd for cmd, _ in actions}) >= 10  # simulate, search, rank, plan, presets, ...


def test_text_settings_list_their_values():
    actions = []
    _walk(build_parser(), [], actions)
    simulate = {a.option_strings[0]: a for cmd, a in actions if cmd == "simulate"}
    assert simulate["--recompute-granularity"].metavar == "{full,selective}"
    assert "RMSNorm" in simulate["--normalization"].metavar
    assert "number of transformer layers" in simulate["--num-layers"].help


def test_every_command_has_json():
    actions = []
    _walk(build_parser(), [], actions)
    commands = {cmd for cmd, _ in actions if cmd != ""}
    commands -= {"calibrate"}  # a group: its actions (fit, check, predict) are the commands
    with_json = {cmd for cmd, a in actions if "--json" in a.option_strings}
    assert commands <= with_json, commands - with_json
