"""Property test (nox -s fuzz): any settings file either parses within bounds or is refused as a
SettingsFileError; nothing else escapes (no RecursionError, MemoryError, raw ValueError)."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mizuoto.settings_files import MAX_DEPTH, SettingsFileError, check_settings, parse_settings

_scalars = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
                     st.text(max_size=8), st.booleans())
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=40)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_values, depth=st.integers(min_value=0, max_value=3 * MAX_DEPTH),
       kind=st.sampled_from(["json", "yaml"]))
def test_hostile_settings_are_parsed_or_named(value, depth, kind):
    text = json.dumps({"v": value})  # JSON is also YAML
    text = text[:-1] + ', "deep": ' + "[" * depth + "]" * depth + "}"
    try:
        data = parse_settings(text, kind, "f")
    except SettingsFileError as exc:
        assert "f" in str(exc)
    else:
        check_settings(data, "f")  # what passed is within the bounds


@settings(max_examples=100, deadline=None)
@given(text=st.text(alphabet="[]{}&*ab:, -\n9\"'=", max_size=200),
       kind=st.sampled_from(["json", "yaml", "toml"]))
def test_random_text_is_parsed_or_named(text, kind):
    try:
        parse_settings(text, kind, "f")
    except SettingsFileError:
        pass
