"""A plugin written against round 2's documented API (1.0) passes today's contract suite.

``toy_api_1_0`` is a frozen copy of the example plugin as it was then (it overrides
``synthesize``/``stream``, resolves its own seed and builds ``Applied`` without ``compute``).
The suite runs on it unchanged: every test passes, and what the plugin will have to change
arrives as a ``PluginAPIDeprecation`` warning in the report, never as a failure.
"""

from __future__ import annotations

import pytest

from mizuoto import plugins

pytest_plugins = ["pytester"]

# Every contract test generated for the frozen toy model passes; none is skipped.
FROZEN_TESTS = 33


@pytest.fixture
def frozen_plugin(monkeypatch):
    """Only the frozen plugin registered (no entry point: it is not installed)."""
    import toy_api_1_0

    monkeypatch.setenv("MIZUOTO_PLUGINS", "")
    plugins.reset_plugins()
    plugins.load_plugins()
    plugins.pm.register(toy_api_1_0, name="toy-api-1.0")
    yield
    plugins.reset_plugins()


def test_a_plugin_written_for_api_1_0_passes_the_suite_with_deprecation_warnings(
        pytester, frozen_plugin):
    result = pytester.runpytest_inprocess("--pyargs", "mizuoto_contract", "-p",
                                          "no:cacheprovider", "--mizuoto-engine", "toy",
                                          "-W", "default::DeprecationWarning")
    outcomes = result.parseoutcomes()
    assert result.ret == 0, result.stdout.str()[-4000:]
    assert outcomes.get("passed") == FROZEN_TESTS and "failed" not in outcomes
    assert "skipped" not in outcomes
    result.stdout.fnmatch_lines(["*PluginAPIDeprecation*overrides Engine.synthesize()*",
                                 "plugin toy_api_1_0 (engine toy) is written for API 1.0; it "
                                 "misses * requirements of 1.1: *test_the_license_is_declared*"],
                                consecutive=False)


def test_the_frozen_plugin_is_still_api_1_0():
    """It must not be edited into passing: it overrides the public calls and builds
    Applied without compute, as third-party plugins written then do."""
    import inspect

    from toy_api_1_0 import engine

    source = inspect.getsource(engine)
    assert "def synthesize(" in source and "def stream(" in source
    assert "compute=" not in source and "resolve_seed(request.seed)" in source
    assert engine.ToyEngine.plugin_api == "1.0"
