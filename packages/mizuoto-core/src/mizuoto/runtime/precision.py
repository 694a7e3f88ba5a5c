"""Kept for plugins that imported mixed precision from here (docs/plugins.md named this
module): it now lives in :mod:`mizuoto.training.precision`, with `Precision`, the one
precision module. Names are imported on first use, with a deprecation."""

from __future__ import annotations

_MOVED = ("DTYPES", "autocast", "grad_scaler", "scaled_step")


def __getattr__(name: str):
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import warnings

    from mizuoto.contracts.api import PluginAPIDeprecation
    from mizuoto.training import precision

    warnings.warn(f"mizuoto.runtime.precision.{name} moved: import it from "
                  "mizuoto.training.precision", PluginAPIDeprecation, stacklevel=2)
    return getattr(precision, name)
