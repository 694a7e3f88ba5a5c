"""The pytest plugin behind the contract suite (entry point ``pytest11: mizuoto_contract``).

It adds ``--mizuoto-engine NAME`` and parametrizes every test that takes ``contract_model``
with the selected fixtures. A test marked ``mizuoto_requires(*capabilities)`` is generated
only for models that declare them, so a model is never "skipped" into a pass: what it lacks is
tested by ``test_unsupported_capability_raises`` instead, and a test no selected model can run
is deselected. Models are loaded at collection (their capabilities decide which tests exist)
and cached for the session.

Each check belongs to a plugin API version (``since_api``, see :mod:`mizuoto_contract.versions`):
a check newer than the plugin's ``plugin_api`` that fails becomes a ``PluginAPIDeprecation``
and passes; the run ends with one line per plugin counting what it misses.

Test suites that do not use ``contract_model`` are left alone (mizuoto is not even imported).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from mizuoto_contract.versions import Missed, later, newer, plugin_of

if TYPE_CHECKING:
    from mizuoto_contract.models import ContractModel, ContractModels

_MODELS = pytest.StashKey["ContractModels"]()
_UNUSED = pytest.StashKey[set[str]]()
# per plugin and the API it is written for: the newer checks it fails (the closing line)
_MISSED = Missed()

# The capabilities a call can be refused for, and so can be tested when a model lacks them.
REFUSABLE = ("zero_shot", "clone", "design", "edit", "stream", "voice_cache")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mizuoto", "Mizuoto contract suite")
    group.addoption("--mizuoto-engine", action="append", default=[], metavar="NAME",
                    help="run the contract suite against this engine's fixtures only "
                         "(repeatable; default: every installed engine)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "mizuoto_requires(*capabilities, when=None): generate this contract test "
        "only for models that declare the capabilities (and whose fixture passes `when`)")
    config.addinivalue_line(
        "markers", "since_api(version): the plugin API version this check's requirement "
        "belongs to; it fails a plugin written for that version or later, and warns an older "
        "one (PluginAPIDeprecation)")
    config.stash[_UNUSED] = set()
    _MISSED.clear()
    from mizuoto_contract.profiles import load_profile

    try:  # the Hypothesis profile of every package's property tests (see profiles.py)
        load_profile()
    except ImportError:  # Hypothesis is not installed: no property tests to configure
        pass


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "contract_model" not in metafunc.fixturenames:
        return
    from mizuoto import Capability

    models = _models(metafunc.config)
    try:
        fixtures = models.fixtures()
    except LookupError as exc:
        raise pytest.UsageError(str(exc)) from None
    marker = metafunc.definition.get_closest_marker("mizuoto_requires")
    required = set(marker.args) if marker else set()
    when = marker.kwargs.get("when") if marker else None
    wants_lacking = "lacking_capability" in metafunc.fixturenames

    params, ids = [], []
    for fixture in fixtures:
        if when is not None and not when(fixture):
            continue
        try:
            capabilities = models.get(fixture).engine.info.capabilities
        except Exception:
            # Unknown capabilities: keep the plain tests, which then fail with the load error.
            if not required and not wants_lacking:
                params.append(fixture)
                ids.append(fixture.id)
            continue
        if not required <= capabilities:
            continue
        if wants_lacking:
            for capability in map(Capability, REFUSABLE):
                if capability not in capabilities:
                    params.append((fixture, capability))
                    ids.append(f"{fixture.id}-{capability.value}")
        else:
            params.append(fixture)
            ids.append(fixture.id)
    if not params:
        # No selected model has what this test needs: deselect it (pytest would otherwise
        # report the empty parameter set as a skip).
        deselect(metafunc)
    if wants_lacking:
        metafunc.parametrize(("contract_model", "lacking_capability"), params, ids=ids,
                             indirect=["contract_model"])
    else:
        metafunc.parametrize("contract_model", params, ids=ids, indirect=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A check newer than the plugin's ``plugin_api`` that fails: a deprecation, not a
    failure (see :mod:`mizuoto_contract.versions`)."""
    try:
        return (yield)
    except (Exception, pytest.fail.Exception) as exc:
        marker = item.get_closest_marker("since_api")
        version = later(marker.args[0] if marker else None, getattr(exc, "since_api", None))
        cls = _plugin_class(item)
        written = getattr(cls, "plugin_api", None)
        if written is None or not newer(version, written):
            raise
        import warnings

        from mizuoto.plugin import PluginAPIDeprecation

        test = getattr(item, "originalname", item.name)
        said = str(exc).strip().split("\n")[0] if isinstance(
            exc, (AssertionError, pytest.fail.Exception)) else f"{type(exc).__name__}: {exc}"
        warnings.warn_explicit(PluginAPIDeprecation(
            f"{plugin_of(cls)} is written for plugin API {written}; {test} checks a "
            f"requirement of API {version}, which it misses: {said} (a warning until API "
            f"{int(written.split('.')[0]) + 1}.0)"), PluginAPIDeprecation,
            str(item.path), (item.location[1] or 0) + 1)
        _MISSED.note(plugin_of(cls), written, version, test)
        return None


def _plugin_class(item: pytest.Item) -> type | None:
    """The engine (or trainer) class a test instance checks, by its parameters; None for a
    test of no one plugin's engine."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if not {"contract_model", "engine_name", "trainer_case", "stopping_trainer_case"} & set(params):
        return None  # not a contract check (another suite's test): mizuoto is not imported
    from mizuoto.registry import get_engine

    try:
        if "contract_model" in params:
            return get_engine(params["contract_model"].engine)
        if "engine_name" in params:
            return get_engine(params["engine_name"])
        for name in ("trainer_case", "stopping_trainer_case"):
            if params.get(name):
                trainer = params[name][0]
                return trainer if hasattr(trainer, "plugin_api") else get_engine(trainer.engine)
    except Exception:  # an engine that does not load: its failure is reported as it is
        return None
    return None


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    for line in _MISSED.closing_lines():
        terminalreporter.write_line(line, yellow=True, bold=True)


def deselect(metafunc: pytest.Metafunc) -> None:
    """Deselect every instance of the test being generated (nothing selected can run it):
    reported as deselected, never as a skip."""
    metafunc.config.stash[_UNUSED].add(metafunc.definition.nodeid)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unused = config.stash[_UNUSED]
    if not unused:
        return
    keep, drop = [], []
    for item in items:
        definition = f"{item.parent.nodeid}::{getattr(item, 'originalname', item.name)}"
        (drop if definition in unused else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def contract_model(request: pytest.FixtureRequest) -> ContractModel:
    """The model (fixture, directory, loaded engine) this test instance runs against."""
    return _models(request.config).get(request.param)


def _models(config: pytest.Config) -> ContractModels:
    if _MODELS not in config.stash:
        from mizuoto_contract.models import ContractModels

        config.stash[_MODELS] = ContractModels(lambda: _session_directory(config),
                                               tuple(config.getoption("mizuoto_engine")))
    return config.stash[_MODELS]


def _session_directory(config: pytest.Config) -> Path:
    """A directory under pytest's session temp dir (``--basetemp`` applies), made on first use."""
    factory = getattr(config, "_tmp_path_factory", None)  # what the tmp_path_factory fixture uses
    if factory is None:
        return Path(tempfile.mkdtemp(prefix="mizuoto-contract-"))
    return factory.mktemp("mizuoto-contract", numbered=True)
