"""`number_at_least`: a params validator for a number with a lower bound, whole where asked
(an integral float from a YAML recipe counts as whole)."""

from __future__ import annotations

import attrs
import pytest

from mizuoto.errors import InvalidRequest
from mizuoto.validation.ranges import number_at_least


@attrs.frozen
class _Params:
    tokens: float | None = attrs.field(
        default=None, validator=number_at_least(1, whole=True, prefix="params.", optional=True))
    decay: float = attrs.field(default=0.0, validator=number_at_least(prefix="params."))


def test_whole_floats_and_bounds_are_read():
    assert _Params(tokens=8192.0).tokens == 8192.0
    assert _Params(tokens=3, decay=0.5) == _Params(tokens=3, decay=0.5)
    assert _Params().tokens is None


@pytest.mark.parametrize(("field", "value", "message"), [
    ("tokens", 2.5, "must be a whole number"), ("tokens", 0, "must be a number >= 1"),
    ("tokens", True, "must be a number >= 1"), ("decay", "0.1", "must be a number >= 0"),
    ("decay", float("nan"), "must be a number >= 0"), ("decay", None, "must be a number")])
def test_a_bad_value_is_named(field, value, message):
    with pytest.raises(InvalidRequest, match=message) as caught:
        _Params(**{field: value})
    assert caught.value.field == f"params.{field}"
