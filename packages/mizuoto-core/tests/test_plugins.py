"""The plugin manager: entry points, MIZUOTO_PLUGINS, and what get_plugins() reports."""

from __future__ import annotations

import importlib.metadata
import logging
import sys

import pytest
from conftest import make_plugin

from mizuoto import hookspecs, plugins, registry


def _fake_entry_points(*entry_points):
    def entry_points_of(group):
        assert group == plugins.ENTRY_POINT_GROUP
        return list(entry_points)

    return entry_points_of


def _entry_point(name: str, value: str):
    return importlib.metadata.EntryPoint(name=name, value=value, group="mizuoto")


@pytest.fixture
def restore_plugins():
    yield
    plugins.reset_plugins()


def test_hookspecs_are_the_four_register_hooks():
    names = sorted(n for n in dir(hookspecs) if n.startswith("register_"))
    assert names == ["register_contract_fixtures", "register_engines", "register_models",
                     "register_trainers"]
    assert sorted(plugins.pm.hook.__dict__) >= names


def test_entry_points_load_once(monkeypatch, restore_plugins):
    module = make_plugin("once")
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        _fake_entry_points(_entry_point("once", "mizuoto_test_once")))
    monkeypatch.setitem(sys.modules, "mizuoto_test_once", module)
    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    plugins.reset_plugins()
    plugins.load_plugins()
    plugins.load_plugins()
    assert [name for name, _ in plugins.pm.list_name_plugin()] == ["once"]
    assert list(registry.engines()) == ["fake"]


def test_mizuoto_plugins_restricts_which_load(monkeypatch, restore_plugins):
    monkeypatch.setitem(sys.modules, "mizuoto_test_a", make_plugin("a"))
    monkeypatch.setitem(sys.modules, "mizuoto_test_b", make_plugin("b", engines=(), trainers=(),
                                                                    models=(), fixtures=()))
    monkeypatch.setattr(importlib.metadata, "entry_points", _fake_entry_points(
        _entry_point("a", "mizuoto_test_a"), _entry_point("b", "mizuoto_test_b")))
    for allowed, expected in (("b", ["b"]), (" a , b ", ["a", "b"]), ("", []), (None, ["a", "b"])):
        if allowed is None:
            monkeypatch.delenv("MIZUOTO_PLUGINS")
        else:
            monkeypatch.setenv("MIZUOTO_PLUGINS", allowed)
        plugins.reset_plugins()
        assert [p["name"] for p in plugins.get_plugins()] == expected, allowed


def test_a_broken_plugin_is_logged_and_skipped(monkeypatch, caplog, restore_plugins):
    monkeypatch.setitem(sys.modules, "mizuoto_test_good", make_plugin("good"))
    monkeypatch.setattr(importlib.metadata, "entry_points", _fake_entry_points(
        _entry_point("broken", "mizuoto_test_no_such_module"),
        _entry_point("good", "mizuoto_test_good")))
    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    plugins.reset_plugins()
    with caplog.at_level(logging.ERROR, logger="mizuoto.plugins"):
        names = [p["name"] for p in plugins.get_plugins()]
    assert names == ["good"]
    assert "could not load plugin broken" in caplog.text


def test_get_plugins_lists_name_distribution_version_hooks(monkeypatch, restore_plugins):
    # The example plugin (docs/examples/mizuoto-example) is installed wherever the tests run.
    monkeypatch.setenv("MIZUOTO_PLUGINS", "example")
    plugins.reset_plugins()
    plugins.pm.register(make_plugin("by_hand", trainers=()), name="by_hand")
    by_hand, example = plugins.get_plugins()
    assert by_hand == {"name": "by_hand", "distribution": None, "version": None,
                       "hooks": ["register_contract_fixtures", "register_engines",
                                 "register_models", "register_trainers"]}
    assert example == {"name": "example", "distribution": "mizuoto-example",
                       "version": importlib.metadata.version("mizuoto-example"),
                       "hooks": ["register_contract_fixtures", "register_engines",
                                 "register_models"]}


def test_reset_plugins_clears_the_registry_cache(fake_plugin):
    assert "fake" in registry.engines()
    plugins.reset_plugins()
    assert plugins.pm.list_name_plugin() == []
    assert registry.engines.cache_info().currsize == 0
