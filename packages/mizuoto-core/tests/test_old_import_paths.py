"""Deep import paths that third-party plugins of earlier rounds copied from the example keep
working after the modules moved, with a deprecation naming the public path."""

from __future__ import annotations

import pytest

from mizuoto.contracts.api import PluginAPIDeprecation


def test_placement_from_runtime_still_imports_with_a_deprecation():
    from mizuoto.contracts import placement

    with pytest.warns(PluginAPIDeprecation, match="import it from mizuoto.plugin"):
        from mizuoto.runtime.placement import Placement, place
    assert (Placement, place) == (placement.Placement, placement.place)


def test_an_unknown_name_is_still_an_attribute_error():
    import mizuoto.runtime.placement as old

    with pytest.raises(AttributeError):
        old.nothing_here  # noqa: B018
