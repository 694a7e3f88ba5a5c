"""How each plugin registers: its module loads and its hooks run, listing it imports no torch,
its engine reference matches the engine, and the start-time CPU options keep its audio.

- ``test_the_plugin_loads_and_its_hooks_run[PLUGIN]``, for every loaded plugin (a plugin
  refused at load is tested too): a hook that raises (a ``register_trainers`` importing a
  module not yet written) registers nothing of that plugin and fails here, naming the plugin,
  the hook and the exception, while every other engine's tests run as usual.
- ``test_listing_the_plugin_imports_no_torch[ENGINE]``, ``test_the_engine_ref_matches_the_engine
  _and_its_models[ENGINE]``: :mod:`mizuoto_contract.registration`'s checks.
- ``test_cpu_startup_options_keep_audio[ENGINE-VARIANT]``: :mod:`mizuoto_contract.startup`'s
  check, on the engine's first fixture, each variant in a fresh interpreter.
"""

from __future__ import annotations

import traceback

import pytest

from mizuoto_contract.startup import STARTUP_VARIANTS

# The hooks a plugin implements, each called with what the hookspec passes (the CLI's
# register_commands gets a throwaway command group).
_LISTINGS = ("engine_refs", "trainers", "catalog", "random_models", "upstream_baselines")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "plugin_name" in metafunc.fixturenames:
        names = sorted({plugin["name"] for plugin in _plugins()})
        metafunc.parametrize("plugin_name", names, ids=names)
    if "engine_name" in metafunc.fixturenames:
        engines = _selected_engines(metafunc.config)
        if "startup_variant" in metafunc.fixturenames:
            cases = [(engine, variant) for engine in engines for variant in STARTUP_VARIANTS]
            metafunc.parametrize(("engine_name", "startup_variant"), cases,
                                 ids=[f"{engine}-{variant}" for engine, variant in cases])
        else:
            metafunc.parametrize("engine_name", engines, ids=engines)


def _plugins() -> list[dict]:
    """Every plugin (loaded or refused), after every hook has been called once."""
    import click

    from mizuoto import registry
    from mizuoto.plugins import call_each, get_plugins

    for listing in _LISTINGS:
        try:
            getattr(registry, listing)()
        except Exception:  # a registry verdict (two plugins, one name): the tests that use it
            pass           # fail with it
    call_each("register_commands", cli=click.Group("contract-probe"))
    return get_plugins()


def _selected_engines(config: pytest.Config) -> list[str]:
    from mizuoto_contract.plugin import _models

    try:
        fixtures = _models(config).fixtures()
    except LookupError:  # reported by the contract tests' own collection
        return []
    return sorted({fixture.engine for fixture in fixtures})


def test_the_plugin_loads_and_its_hooks_run(plugin_name):
    from mizuoto.plugins import hook_errors

    plugin = next(p for p in _plugins() if p["name"] == plugin_name)
    raised = {hook: exc for (name, hook), exc in sorted(hook_errors().items())
              if name == plugin_name}
    refused = [e for e in plugin["errors"] if not any(e.startswith(f"{h} raised") for h in raised)]
    said = [f"plugin {plugin_name!r} was not loaded: {error}" for error in refused]
    for hook, exc in raised.items():
        said.append(f"plugin {plugin_name!r}: its {hook} hook raised {type(exc).__name__}: "
                    f"{exc}; nothing it registers there is available (the other plugins "
                    f"are). Traceback:\n"
                    + "".join(traceback.format_exception(exc)).rstrip())
    assert not said, "\n".join(said)


# round 4's registration checks: a plugin written for API 1.0 (torch imported at registration,
# an engine that does more than its registration says) gets a deprecation (versions.py)
@pytest.mark.since_api("1.1")
def test_listing_the_plugin_imports_no_torch(engine_name, tmp_path):
    from mizuoto_contract.registration import check_listing_imports_no_torch, registered_by

    plugin, engines = registered_by(engine_name)
    check_listing_imports_no_torch(plugin, engines, cwd=tmp_path)


@pytest.mark.since_api("1.1")
def test_the_engine_ref_matches_the_engine_and_its_models(engine_name, request):
    from mizuoto.registry import engine_refs
    from mizuoto_contract.plugin import _models
    from mizuoto_contract.registration import check_ref_against_models

    models = _models(request.config)
    own = [models.get(fixture) for fixture in models.fixtures() if fixture.engine == engine_name]
    check_ref_against_models(engine_refs()[engine_name], type(own[0].engine),
                             {model.fixture.id: model.engine.info.capabilities for model in own})


def test_cpu_startup_options_keep_audio(engine_name, startup_variant, request, tmp_path):
    from mizuoto import Capability
    from mizuoto_contract.plugin import _models
    from mizuoto_contract.reference import REFERENCE_TEXT
    from mizuoto_contract.startup import check_startup_variant_keeps_audio

    models = _models(request.config)
    fixture = next(f for f in models.fixtures() if f.engine == engine_name)
    model = models.get(fixture)
    fields = {"text": "Same bytes.", "seed": 7, "params": dict(fixture.request_params)}
    if Capability.ZERO_SHOT not in model.engine.info.capabilities:
        fields["reference"] = {"audio": str(model.reference_path), "text": REFERENCE_TEXT}
    if fixture.steps is not None:
        fields["steps"] = fixture.steps
    check_startup_variant_keeps_audio(engine_name, model.directory, fields, startup_variant,
                                      tmp_path)
