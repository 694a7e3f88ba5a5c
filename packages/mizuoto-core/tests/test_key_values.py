"""One ``KEY=VALUE`` parser: ``--option``, ``--param`` and a recipe's ``--param`` read the same
pairs into the same values; each names its own flag when a pair is malformed."""

from __future__ import annotations

import pytest

from mizuoto.command_options import command_params
from mizuoto.errors import InvalidOption, InvalidRequest
from mizuoto.key_values import parse_pairs, parse_value
from mizuoto.options import Options
from mizuoto.training.recipe import parse_params

PAIRS = ["a=3", " b = 1e-4 ", "c=true", 'd=["q", "k"]', "e=fast", 'f="quoted text"', "g=",
         "h=x=y", "a=4"]
VALUES = {"a": 4, "b": 1e-4, "c": True, "d": ["q", "k"], "e": "fast", "f": "quoted text",
          "g": "", "h": "x=y"}


def test_values_are_toml_else_text():
    assert parse_pairs(PAIRS, ValueError) == VALUES
    assert parse_value("[1, 2") == "[1, 2"
    # a line break cannot smuggle in a second key: that is text, not the first value
    assert parse_value("1\nother = 2") == "1\nother = 2"


def test_every_caller_reads_the_same_values():
    assert command_params(PAIRS) == parse_params(PAIRS) == VALUES
    engine = Options().with_overrides([f"engines.toy.{pair.strip()}" for pair in PAIRS])
    assert dict(engine.engine("toy")) == VALUES


@pytest.mark.parametrize("pair", ["no_equals_sign", "=3", " = 3"])
def test_a_malformed_pair_is_named_by_each_callers_flag(pair):
    with pytest.raises(InvalidRequest, match="^--param: .*key=value"):
        command_params([pair])
    with pytest.raises(InvalidRequest, match="^--param: .*KEY=VALUE"):
        parse_params([pair])
    with pytest.raises(InvalidOption, match="must be written key=value") as raised:
        Options().with_overrides([pair])
    assert raised.value.key == pair
