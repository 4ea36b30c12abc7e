"""Errata files of odd shapes (issue 41): each is one ConfigError naming the file and the rule, never a
RecursionError (deep nesting) or a TypeError (a list or mapping where a source id goes)."""

from __future__ import annotations

import pytest

from echo_tune.errors import ConfigError
from echo_tune.validate.errata import load_errata

SOURCE = """sources:
  recipe:
    source: "example/repo@0123456789ab conf/tiny.yaml"
    settings:
      - flags: "--hidden-dropout 0.0"
        quote: "hidden_dropout: 0.0"
{extra}rows:
{rows}
"""


def _errata(tmp_path, rows="  tiny: [recipe]", extra=""):
    path = tmp_path / "errata.yaml"
    path.write_text(SOURCE.format(rows=rows, extra=extra))
    return path


def _one_line_error(path, *fragments):
    with pytest.raises(ConfigError) as caught:
        load_errata(path)
    message = str(caught.value)
    assert "\n" not in message and f"errata file {str(path)!r}" in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_a_well_formed_file_still_loads(tmp_path):
    rows = load_errata(_errata(tmp_path))
    assert list(rows) == ["tiny"] and rows["tiny"][0].flags == "--hidden-dropout 0.0"


@pytest.mark.parametrize("text", ["[" * 10_000 + "]" * 10_000, "rows:\n  r: " + "[" * 10_000 + "]" * 10_000 + "\n"])
def test_a_file_nested_ten_thousand_deep_is_refused_by_its_depth(tmp_path, text):
    path = tmp_path / "errata.yaml"
    path.write_text(text)
    _one_line_error(path, "nests deeper than 64 levels", "`depth <= 64` must hold")


@pytest.mark.parametrize("entry", ["[[recipe]]", "[{recipe: 1}]", "[recipe, [recipe]]", "[7]"])
def test_a_row_entry_that_is_not_a_source_id_is_named(tmp_path, entry):
    _one_line_error(_errata(tmp_path, rows=f"  tiny: {entry}"), "row 'tiny' must list source ids of `sources`")


@pytest.mark.parametrize("rows,what,key", [("  5: [recipe]", "row name", "5"), ("  true: [recipe]", "row name", "True")])
def test_a_row_name_that_is_not_text_is_named(tmp_path, rows, what, key):
    _one_line_error(_errata(tmp_path, rows=rows), f"each {what} must be text, but got {key}", "quote it")


def test_a_source_id_that_is_not_text_is_named(tmp_path):
    extra = ('  12:\n    source: "example/repo@0123456789ab conf/x.yaml"\n    settings:\n'
             '      - flags: "--attention-dropout 0.0"\n        quote: "attention_dropout: 0.0"\n')
    _one_line_error(_errata(tmp_path, extra=extra), "each source id must be text, but got 12 (int)")


def test_a_mapping_or_list_as_a_key_is_a_yaml_error_in_one_line(tmp_path):
    _one_line_error(_errata(tmp_path, rows="  ? [tiny]\n  : [recipe]"), "is not valid YAML at line", "unhashable")


def test_corrects_of_the_wrong_shape_is_named(tmp_path):
    path = tmp_path / "errata.yaml"
    path.write_text(SOURCE.format(extra="", rows="  tiny: [recipe]").replace(
        'quote: "hidden_dropout: 0.0"', 'quote: "hidden_dropout: 0.0"\n        corrects: {hidden_dropout: 1}\n'
                                        '        reason: "x"'))
    _one_line_error(path, "`corrects` of 'recipe' must be a field name or a list of them")


def test_a_file_that_is_not_a_mapping_or_not_text(tmp_path):
    path = tmp_path / "errata.yaml"
    path.write_text("- a\n- b\n")
    _one_line_error(path, "must hold a YAML mapping")
    path.write_bytes(b"rows: \xff\xfe\n")
    with pytest.raises(ConfigError, match="errata file") as caught:
        load_errata(path)
    assert "\n" not in str(caught.value)
