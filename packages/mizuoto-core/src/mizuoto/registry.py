"""What the loaded plugins registered: engines, trainers, catalog entries, contract fixtures."""

from __future__ import annotations

import functools

from mizuoto.catalog import CatalogEntry
from mizuoto.contracts.engine import Engine
from mizuoto.contracts.fixtures import ContractFixture
from mizuoto.contracts.trainer import Trainer
from mizuoto.errors import EngineNotFound, MizuotoError
from mizuoto.plugins import load_plugins, pm


def _collect(hook, key, kind: str) -> dict:
    load_plugins()
    found: dict = {}

    def register(item):
        name = key(item)
        if name in found and found[name] is not item:
            raise MizuotoError(f"two plugins register the {kind} {name!r}")
        found[name] = item

    hook(register=register)
    return found


@functools.cache
def engines() -> dict[str, type[Engine]]:
    return _collect(pm.hook.register_engines, lambda e: e.name, "engine")


@functools.cache
def trainers() -> dict[tuple[str, str], type[Trainer]]:
    collected = _collect(pm.hook.register_trainers, lambda t: (t.engine, t.__name__), "trainer")
    return collected


@functools.cache
def catalog() -> dict[str, CatalogEntry]:
    return _collect(pm.hook.register_models, lambda m: m.id, "model")


@functools.cache
def contract_fixtures() -> dict[str, ContractFixture]:
    return _collect(pm.hook.register_contract_fixtures, lambda f: f.id, "contract fixture")


def clear_cache() -> None:
    for function in (engines, trainers, catalog, contract_fixtures):
        function.cache_clear()


def get_engine(name: str) -> type[Engine]:
    available = engines()
    if name not in available:
        if not available:
            raise EngineNotFound(
                f"engine {name!r} is not installed, and no engine is: "
                f"pip install mizuoto-{name} (or ./packages/mizuoto-{name})"
            )
        raise EngineNotFound(
            f"engine {name!r} is not installed; installed: {', '.join(sorted(available))}"
        )
    return available[name]


def get_trainer(engine: str) -> type[Trainer]:
    for (engine_name, _), trainer in trainers().items():
        if engine_name == engine:
            return trainer
    raise EngineNotFound(f"no trainer is installed for engine {engine!r}")
