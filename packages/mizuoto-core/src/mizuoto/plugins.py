"""The plugin manager: loads every ``mizuoto`` entry point once.

``MIZUOTO_PLUGINS`` restricts which load: a comma-separated list of entry-point names (an empty
value loads none).
"""

from __future__ import annotations

import difflib
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
        except Exception as exc:
            log.exception("could not load plugin %s (%s)", entry_point.name, entry_point.value)
            _errors[entry_point.name] = [f"importing {entry_point.value} failed: "
                                         f"{type(exc).__name__}: {exc}"]
            continue
        unknown = unknown_hooks(module)
        if unknown:
            # pluggy would accept these silently until check_pending(); a misspelled hook is a
            # plugin that quietly does nothing, so it is named here and the plugin is refused
            _errors[entry_point.name] = unknown
            log.error("plugin %s not loaded: %s", entry_point.name, "; ".join(unknown))
        else:
            pm.register(module, name=entry_point.name)
        dist = entry_point.dist
        _distributions[entry_point.name] = (dist.name, dist.version) if dist else (None, None)
    pm.check_pending()


_distributions: dict[str, tuple[str | None, str | None]] = {}
_errors: dict[str, list[str]] = {}
# (plugin, hook) -> what its hook raised, kept so that the contract suite can fail on it
_hook_errors: dict[tuple[str, str], BaseException] = {}


def call_each(hook_name: str, **kwargs) -> None:
    """Call every plugin's ``hook_name`` implementation in pluggy's order, each on its own: one
    that raises is logged and recorded (:func:`hook_errors`) and the others still run, so that
    one broken plugin (a ``register_trainers`` importing a module not written yet) hides no
    other plugin's engines."""
    load_plugins()
    for impl in reversed(getattr(pm.hook, hook_name).get_hookimpls()):
        try:
            impl.function(*(kwargs[name] for name in impl.argnames))
        except Exception as exc:
            log.error("plugin %s: its %s hook raised %s: %s", impl.plugin_name, hook_name,
                      type(exc).__name__, exc, exc_info=True)
            _hook_errors[(impl.plugin_name, hook_name)] = exc


def hook_errors() -> dict[tuple[str, str], BaseException]:
    """What each ``(plugin, hook)`` that raised raised, for the hooks called so far."""
    return dict(_hook_errors)


def _spec_names() -> set[str]:
    return {name for name in dir(hookspecs) if pm.parse_hookspec_opts(hookspecs, name)}


def unknown_hooks(module) -> list[str]:
    """One message per ``@hookimpl`` in ``module`` that matches no Mizuoto hookspec."""
    specs = _spec_names()
    messages = []
    for name in dir(module):
        if name in specs or pm.parse_hookimpl_opts(module, name) is None:
            continue
        close = difflib.get_close_matches(name, sorted(specs), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        messages.append(f"unknown hook {name!r}{hint}; hooks are {', '.join(sorted(specs))}")
    return messages


def reset_plugins() -> None:
    """Unregister every plugin so the next :func:`load_plugins` reads entry points again."""
    global _loaded
    for name, plugin in list(pm.list_name_plugin()):
        pm.unregister(plugin, name=name)
    _distributions.clear()
    _errors.clear()
    _hook_errors.clear()
    _loaded = False
    for callback in _on_reset:
        callback()


_on_reset: list = []


def on_reset(callback) -> None:
    """Call ``callback()`` whenever :func:`reset_plugins` runs (the registry clears its caches);
    modules above this one register here, so that this one imports none of them."""
    if callback not in _on_reset:
        _on_reset.append(callback)


def get_plugins() -> list[dict]:
    """Each plugin: name, distribution, version, the hooks it implements and, for a plugin that
    was refused (a hook that matches no hookspec), its ``errors``."""
    load_plugins()
    plugins = []
    for name, plugin in sorted(pm.list_name_plugin()):
        hooks = sorted(h.name for h in pm.get_hookcallers(plugin) or [])
        dist, version = _distributions.get(name, (None, None))
        raised = [f"{hook} raised {type(exc).__name__}: {exc}"
                  for (plugin_name, hook), exc in sorted(_hook_errors.items(), key=str)
                  if plugin_name == name]
        plugins.append({"name": name, "distribution": dist, "version": version, "hooks": hooks,
                        "errors": raised})
    for name, errors in sorted(_errors.items()):
        dist, version = _distributions.get(name, (None, None))
        plugins.append({"name": name, "distribution": dist, "version": version, "hooks": [],
                        "errors": list(errors)})
    return plugins
