"""The plugin manager: entry points, MIZUOTO_PLUGINS, and what get_plugins() reports."""

from __future__ import annotations

import importlib.metadata
import logging
import sys

import pytest
from conftest import make_plugin

import mizuoto
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


def test_hookspecs_are_the_register_hooks():
    names = sorted(n for n in dir(hookspecs) if n.startswith("register_"))
    assert names == ["register_commands", "register_contract_fixtures", "register_engines",
                     "register_models", "register_trainers", "register_upstream_baselines"]
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
        found = {p["name"]: p for p in plugins.get_plugins()}
    assert list(found) == ["good", "broken"]  # listed with its error, for `mizuoto plugins`
    assert found["good"]["errors"] == [] and found["broken"]["hooks"] == []
    assert found["broken"]["errors"] == ["importing mizuoto_test_no_such_module failed: "
                                         "ModuleNotFoundError: No module named "
                                         "'mizuoto_test_no_such_module'"]
    assert "could not load plugin broken" in caplog.text


def test_get_plugins_lists_name_distribution_version_hooks(monkeypatch, restore_plugins):
    # The example plugin (docs/examples/mizuoto-example) is installed wherever the tests run.
    monkeypatch.setenv("MIZUOTO_PLUGINS", "toy")
    plugins.reset_plugins()
    plugins.pm.register(make_plugin("by_hand", trainers=()), name="by_hand")
    by_hand, example = plugins.get_plugins()
    assert by_hand == {"name": "by_hand", "distribution": None, "version": None,
                       "hooks": ["register_contract_fixtures", "register_engines",
                                 "register_models", "register_trainers"], "errors": []}
    assert example == {"name": "toy", "distribution": "mizuoto-example",
                       "version": importlib.metadata.version("mizuoto-example"),
                       "hooks": ["register_contract_fixtures", "register_engines",
                                 "register_models", "register_trainers"], "errors": []}


def test_reset_plugins_clears_the_registry_cache(fake_plugin):
    assert "fake" in registry.engines()
    plugins.reset_plugins()
    assert plugins.pm.list_name_plugin() == []
    assert registry.engines.cache_info().currsize == 0


def test_a_misspelled_hook_is_named_and_other_plugins_still_load(monkeypatch, caplog,
                                                                 restore_plugins):
    typo = make_plugin("typo", engines=(), trainers=(), models=(), fixtures=())

    @mizuoto.hookimpl
    def register_engine(register):  # missing "s": pluggy alone would accept it silently
        raise AssertionError("never called")

    typo.register_engine = register_engine
    monkeypatch.setitem(sys.modules, "mizuoto_test_typo", typo)
    monkeypatch.setitem(sys.modules, "mizuoto_test_good", make_plugin("good"))
    monkeypatch.setattr(importlib.metadata, "entry_points", _fake_entry_points(
        _entry_point("typo", "mizuoto_test_typo"), _entry_point("good", "mizuoto_test_good")))
    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    plugins.reset_plugins()
    with caplog.at_level(logging.ERROR, logger="mizuoto.plugins"):
        found = {p["name"]: p for p in plugins.get_plugins()}
    assert found["good"]["errors"] == [] and found["good"]["hooks"]
    assert found["typo"]["hooks"] == []
    [error] = found["typo"]["errors"]
    assert "'register_engine'" in error and "did you mean 'register_engines'" in error
    assert "plugin typo not loaded" in caplog.text
    assert list(registry.engines()) == ["fake"]


def test_register_commands_adds_a_command_but_cannot_replace_ours(monkeypatch, restore_plugins):
    import click
    from click.testing import CliRunner

    from mizuoto import cli as cli_module

    module = make_plugin("cmds", engines=(), trainers=(), models=(), fixtures=())

    @mizuoto.hookimpl
    def register_commands(cli):
        @cli.command(name="hum")
        def hum():
            """Hum a tune."""
            click.echo("hmm")

        @cli.command(name="plugins")
        def hijack():
            click.echo("hijacked")

    module.register_commands = register_commands
    monkeypatch.setitem(sys.modules, "mizuoto_test_cmds", module)
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        _fake_entry_points(_entry_point("cmds", "mizuoto_test_cmds")))
    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    plugins.reset_plugins()
    group = cli_module.cli
    monkeypatch.setattr(group, "commands", dict(group.commands))
    monkeypatch.setattr(group, "_plugin_commands_added", False)
    runner = CliRunner()
    assert runner.invoke(group, ["hum"]).output == "hmm\n"
    assert "hum" in runner.invoke(group, ["--help"]).output
    assert "hijacked" not in runner.invoke(group, ["plugins"]).output
