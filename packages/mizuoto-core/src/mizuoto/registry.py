"""What the loaded plugins registered: engines, trainers, catalog entries, contract fixtures,
upstream baselines.

Engines are kept as :class:`~mizuoto.contracts.engine_ref.EngineRef`: listing them
(:func:`engine_refs`) imports no engine module; :func:`get_engine` and :func:`engines` do.
"""

from __future__ import annotations

import functools

from mizuoto.catalog import CatalogEntry
from mizuoto.contracts.baselines import UpstreamBaseline
from mizuoto.contracts.engine import Engine
from mizuoto.contracts.engine_ref import EngineRef
from mizuoto.contracts.fixtures import ContractFixture
from mizuoto.contracts.trainer import Trainer
from mizuoto.errors import EngineNotFound, MizuotoError
from mizuoto.options import Options
from mizuoto.plugins import call_each, on_reset, pm


def _collect(hook, key, kind: str, convert=lambda item: item) -> dict:
    """What every plugin registers with ``hook``; a plugin whose hook raises registers nothing
    and is recorded (:func:`mizuoto.plugins.hook_errors`), the others count."""
    found: dict = {}
    refused: list[MizuotoError] = []  # the registry's own verdicts fail the whole listing

    def register(item):
        try:
            item = convert(item)
            name = key(item)
            if name in found and found[name] != item:
                raise MizuotoError(f"two plugins register the {kind} {name!r}")
        except MizuotoError as exc:
            refused.append(exc)
            return
        found[name] = item

    call_each(hook.name, register=register)
    if refused:
        raise refused[0]
    return found


def _engine_ref(item) -> EngineRef:
    if isinstance(item, EngineRef):
        return item
    if isinstance(item, type) and issubclass(item, Engine):
        return EngineRef.of(item)
    raise MizuotoError(f"register_engines: register an Engine subclass or an EngineRef, "
                       f"not {item!r}")


@functools.cache
def engine_refs() -> dict[str, EngineRef]:
    """Every registered engine by name, as registered: nothing is imported."""
    return _collect(pm.hook.register_engines, lambda ref: ref.name, "engine", _engine_ref)


@functools.cache
def engines() -> dict[str, type[Engine]]:
    """Every registered engine class by name (this imports every engine)."""
    return {name: ref.load() for name, ref in engine_refs().items()}


@functools.cache
def trainers() -> dict[tuple[str, str], type[Trainer]]:
    collected = _collect(pm.hook.register_trainers, lambda t: (t.engine, t.__name__), "trainer")
    return collected


@functools.cache
def catalog() -> dict[str, CatalogEntry]:
    return _collect(pm.hook.register_models, lambda m: m.id, "model")


@functools.cache
def random_models() -> dict[str, ContractFixture]:
    """Every random-init model recipe, real-size ones included (``mizuoto random-model``,
    ``mizuoto bench random:ID``)."""
    return _collect(pm.hook.register_contract_fixtures, lambda f: f.id, "contract fixture")


@functools.cache
def contract_fixtures() -> dict[str, ContractFixture]:
    """The small recipes the contract suite runs: real-size ones (minutes per request) left
    out."""
    return {key: fixture for key, fixture in random_models().items() if not fixture.realsize}


@functools.cache
def upstream_baselines() -> dict[str, UpstreamBaseline]:
    """The upstream package each engine reproduces, by engine name (``mizuoto bench
    --against-upstream``); nothing is imported."""
    return _collect(pm.hook.register_upstream_baselines, lambda b: b.engine, "upstream baseline")


def clear_cache() -> None:
    for function in (engine_refs, engines, trainers, catalog, random_models, contract_fixtures,
                     upstream_baselines):
        function.cache_clear()


on_reset(clear_cache)


def validate_engine_options(options: Options) -> None:
    """Check the ``engines.<name>`` sections of installed engines now (others are kept as
    given); an engine checks its own section again when it loads. Imports each named engine's
    options class only."""
    installed = engine_refs()
    for name in options.engines:
        if name in installed:
            options.engine_options(installed[name])


def get_engine(name: str) -> type[Engine]:
    """The engine class registered as ``name``, imported now if it was registered lazily."""
    available = engine_refs()
    if name not in available:
        if not available:
            raise EngineNotFound(
                f"engine {name!r} is not installed, and no engine is: "
                f"pip install ./packages/mizuoto-{name} from a clone of Mizuoto's repository "
                "(no release is published yet)"
            )
        raise EngineNotFound(
            f"engine {name!r} is not installed; installed: {', '.join(sorted(available))}"
        )
    return available[name].load()


def get_trainer(engine: str) -> type[Trainer]:
    for (engine_name, _), trainer in trainers().items():
        if engine_name == engine:
            return trainer
    raise EngineNotFound(f"no trainer is installed for engine {engine!r}")
