"""The plugin manager: loads every ``mizuoto`` entry point once.

``MIZUOTO_PLUGINS`` restricts which load: a comma-separated list of entry-point names (an empty
value loads none).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os

import pluggy

from mizuoto import hookspecs

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "mizuoto"

pm = pluggy.PluginManager("mizuoto")
pm.add_hookspecs(hookspecs)

_loaded = False


def load_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    allowed = os.environ.get("MIZUOTO_PLUGINS")
    names = None if allowed is None else {n.strip() for n in allowed.split(",") if n.strip()}
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if names is not None and entry_point.name not in names:
            continue
        if pm.has_plugin(entry_point.name):
            continue
        try:
            module = entry_point.load()
        except Exception:
            log.exception("could not load plugin %s (%s)", entry_point.name, entry_point.value)
            continue
        pm.register(module, name=entry_point.name)
        dist = entry_point.dist
        _distributions[entry_point.name] = (dist.name, dist.version) if dist else (None, None)


_distributions: dict[str, tuple[str | None, str | None]] = {}


def reset_plugins() -> None:
    """Unregister every plugin so the next :func:`load_plugins` reads entry points again."""
    global _loaded
    for name, plugin in list(pm.list_name_plugin()):
        pm.unregister(plugin, name=name)
    _distributions.clear()
    _loaded = False
    from mizuoto import registry

    registry.clear_cache()


def get_plugins() -> list[dict]:
    """Each loaded plugin: name, distribution, version and the hooks it implements."""
    load_plugins()
    plugins = []
    for name, plugin in sorted(pm.list_name_plugin()):
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        dist, version = _distributions.get(name, (None, None))
        plugins.append({"name": name, "distribution": dist, "version": version, "hooks": hooks})
    return plugins
