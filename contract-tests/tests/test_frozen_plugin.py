"""Plugins written against earlier documented APIs pass today's contract suite unchanged.

``toy_api_1_0`` is a frozen copy of the example plugin as it was in round 2 (API 1.0: it
overrides ``synthesize``/``stream``, resolves its own seed and builds ``Applied`` without
``compute``): every test passes, and what it will have to change arrives as
``PluginAPIDeprecation`` warnings and a closing line, never as a failure. ``toy_api_1_1`` is a
plugin written against API 1.1's docs (``mizuoto.plugin`` only, ``_stream`` only): every test
passes with no deprecation.
"""

from __future__ import annotations

# pytester's in-process runs forget every module imported inside them: numpy refuses a second
# import in one process ("cannot load module more than once per process"), and torch's
# compiler a second registration of its operators, so both are imported here, before any run,
# and kept for every test of this module.
import numpy  # noqa: F401
import pytest
import torch
import torch._dynamo  # noqa: F401
from suite_selection import FRESH_PROCESS_TESTS

from mizuoto import plugins

pytest_plugins = ["pytester"]

# Every contract test generated for the frozen toy model passes; none is skipped (with the 2
# of test_plugin_contract run in this process: the plugin's hooks run, its EngineRef matches).
# Round 5: the behaviour checks run on it too (no license gate) and the text-coverage check is
# new; those it misses are deprecations (it is written for API 1.0).
FROZEN_TESTS = 42
# The round-3 trainer's trainer tests run in this process (of 6: SIGKILL and stop signals not).
FROZEN_TRAINER_TESTS = 6
# The same for the API 1.1 plugin (no trainer: the trainer tests are deselected).
FROZEN_1_1_TESTS = 42


def _only(monkeypatch, module, name):
    """Only ``module`` registered as a plugin (no entry point: it is not installed)."""
    monkeypatch.setenv("MIZUOTO_PLUGINS", "")
    plugins.reset_plugins()
    plugins.load_plugins()
    plugins.pm.register(module, name=name)


@pytest.fixture
def frozen_plugin(monkeypatch):
    import toy_api_1_0

    _only(monkeypatch, toy_api_1_0, "toy-api-1.0")
    yield
    plugins.reset_plugins()


@pytest.fixture
def frozen_plugin_1_1(monkeypatch):
    import toy_api_1_1

    _only(monkeypatch, toy_api_1_1, "toy-api-1.1")
    yield
    plugins.reset_plugins()


def _run_suite(pytester, engine, passed):
    """The whole suite on ``engine``: ``passed`` tests pass, none fails or is skipped."""
    # the checks in fresh interpreters find plugins by their entry points: these are not
    # installed (registered in this process only)
    result = pytester.runpytest_inprocess("--pyargs", "mizuoto_contract", "-p",
                                          "no:cacheprovider", "--mizuoto-engine", engine,
                                          "-k", f"not ({FRESH_PROCESS_TESTS})",
                                          "-W", "default::DeprecationWarning")
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()[-4000:]
    assert outcomes.get("passed") == passed and "failed" not in outcomes
    assert "skipped" not in outcomes
    return result


def test_a_plugin_written_for_api_1_0_passes_the_suite_with_deprecation_warnings(
        pytester, frozen_plugin):
    result = _run_suite(pytester, "toy", FROZEN_TESTS)
    result.stdout.fnmatch_lines(["*PluginAPIDeprecation*overrides Engine.synthesize()*",
                                 "plugin toy_api_1_0 (engine toy) is written for API 1.0; it "
                                 "misses * requirements of 1.1: *test_the_license_is_declared*"],
                                consecutive=False)


def test_a_trainer_written_on_the_round_3_toolkit_passes_the_trainer_tests(
        pytester, frozen_plugin):
    """The round-3 trainer, frozen, trains the round-2 engine. The trainer tests that run in a
    child process (SIGKILL, stop signals) reach only installed plugins: these are not."""
    import toy_trainer_round3

    from mizuoto import registry

    plugins.pm.register(toy_trainer_round3, name="toy-trainer-round-3")
    registry.trainers.cache_clear()
    try:
        result = pytester.runpytest_inprocess(
            "--pyargs", "mizuoto_contract", "-p", "no:cacheprovider", "--mizuoto-engine", "toy",
            "-k", "trainer_contract and not sigkill and not stop_signal")
    finally:
        registry.trainers.cache_clear()
    assert result.ret == 0, result.stdout.str()[-4000:]
    result.assert_outcomes(passed=FROZEN_TRAINER_TESTS)


def test_the_frozen_plugin_is_still_api_1_0():
    """It must not be edited into passing: it overrides the public calls and builds
    Applied without compute, as third-party plugins written then do."""
    import inspect

    from toy_api_1_0 import engine

    source = inspect.getsource(engine)
    assert "def synthesize(" in source and "def stream(" in source
    assert "compute=" not in source and "resolve_seed(request.seed)" in source
    assert engine.ToyEngine.plugin_api == "1.0"


def test_a_plugin_written_for_api_1_1_passes_the_suite_without_deprecations(
        pytester, frozen_plugin_1_1):
    result = _run_suite(pytester, "chime", FROZEN_1_1_TESTS)
    assert "PluginAPIDeprecation" not in result.stdout.str()


def test_the_frozen_1_1_plugin_stands_on_the_public_api_only():
    """It must not be edited into passing: it imports only mizuoto.plugin and implements
    only _stream, as the API 1.1 docs let a plugin do."""
    import ast
    import inspect

    import toy_api_1_1
    from toy_api_1_1 import engine

    for module in (toy_api_1_1, engine):
        tree = ast.parse(inspect.getsource(module))
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert {m for m in imported if m.startswith("mizuoto")} == {"mizuoto.plugin"}
    assert "_synthesize" not in engine.ChimeEngine.__dict__
    assert engine.ChimeEngine.plugin_api == "1.1"
