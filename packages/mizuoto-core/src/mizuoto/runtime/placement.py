"""Kept for plugins written before ``mizuoto.plugin`` existed: the round-3 example imported
``Placement`` and ``place`` from here, so third-party plugins copied that. Both now live next to
``Engine``, in :mod:`mizuoto.contracts.placement` (public: ``mizuoto.plugin``). This module
imports them on first use, with a deprecation, so that ``runtime`` itself stays below
``contracts`` (``test_import_layers`` counts this module as a front end)."""

from __future__ import annotations

_MOVED = ("Placement", "PlacedEngine", "place")


def __getattr__(name: str):
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    from mizuoto.contracts import placement
    from mizuoto.contracts.api import PluginAPIDeprecation

    warnings.warn(f"mizuoto.runtime.placement.{name} moved: import it from mizuoto.plugin",
                  PluginAPIDeprecation, stacklevel=2)
    return getattr(placement, name)
