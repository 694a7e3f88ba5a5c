"""The plugin API's version, and the warning that announces a change a plugin must make.

``API_VERSION`` is ``"MAJOR.MINOR"``. A plugin written against any earlier minor version of
the same major keeps working, unchanged: what the base class can do for a plugin, it does
(e.g. ``applied.compute`` is filled in when a plugin leaves it out). A requirement that needs a
plugin to change is announced first as a :class:`PluginAPIDeprecation` warning (the contract
suite reports it and still passes) for at least one minor version, with an entry in
``docs/changelog.md``, and only then enforced, in the next major version.

History: 1.0 (round 2's documented API: plugins override ``synthesize``/``stream``/...,
build ``Applied`` themselves); 1.1 (the base class does the shared work and calls
``_synthesize``/``_stream``/``_edit``/``_build_voice``; ``Engine.concurrent_requests``,
deprecated since for ``Engine.takes_turns_per`` or the step interface: the core schedules).
"""

from __future__ import annotations

API_VERSION = "1.1"


class PluginAPIDeprecation(DeprecationWarning):
    """A plugin relies on something the next major plugin API drops; the message says what
    to change. Shown by the contract suite (and by Python with ``-W default``); never fails."""


def deprecated(message: str, *, stacklevel: int = 2) -> None:
    """Warn a plugin author (see :class:`PluginAPIDeprecation`)."""
    import warnings

    warnings.warn(PluginAPIDeprecation(message), stacklevel=stacklevel + 1)
