"""Fixtures for core's unit tests: an in-test plugin with a fake engine, and a clean registry."""

from __future__ import annotations

import types
from pathlib import Path

import attrs
import pytest

import mizuoto
from mizuoto import (
    Applied,
    Audio,
    Capability,
    CatalogEntry,
    ContractFixture,
    Engine,
    HubFile,
    ModelInfo,
    SynthesisResult,
    Trainer,
    plugins,
    registry,
)


@attrs.frozen
class FakeOptions:
    level: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    label: str = "plain"


@attrs.frozen
class FakeParams:
    speed: float = 1.0


class FakeEngine(Engine):
    """Loads any directory holding ``fake.json``; speaks one second of zeros."""

    name = "fake"
    params_class = FakeParams
    options_class = FakeOptions

    def __init__(self, model: str, options: FakeOptions) -> None:
        self.options = options
        self._info = ModelInfo("fake", model, "v0", 8000, "float32", "cpu",
                               frozenset({Capability.ZERO_SHOT}))

    @classmethod
    def recognizes(cls, model_dir: Path) -> bool:
        return (Path(model_dir) / "fake.json").is_file()

    @classmethod
    def load(cls, model_dir, *, options=None, model_id=None, progress=None):
        options = options or mizuoto.Options()
        return cls(model_id or str(model_dir), options.engine_options(cls))

    @property
    def info(self) -> ModelInfo:
        return self._info

    def synthesize(self, request, *, progress=None):
        self.parse_params(request.params)
        applied = Applied("fake", self._info.model, request.seed or 0, request.seed is None,
                          "float32", "cpu")
        return SynthesisResult(Audio([0.0] * 8000, 8000), applied)


class FakeTrainer(Trainer):
    engine = "fake"
    methods = frozenset({"full"})

    def prepare(self, config, *, progress=None):
        return config

    def train(self, run, *, progress=None):
        raise NotImplementedError

    def export(self, run, destination):
        raise NotImplementedError


FAKE_ENTRY = CatalogEntry(
    id="fake/base", engine="fake",
    files={"fake.json": HubFile("mizuoto-test/fake", "fake.json"),
           "weights.bin": HubFile("mizuoto-test/fake", "weights.bin")},
    license="CC0-1.0",
)


def _write_fake(directory: Path) -> None:
    (directory / "fake.json").write_text("{}")


FAKE_FIXTURE = ContractFixture(engine="fake", name="tiny", make=_write_fake)


def make_plugin(name: str = "fake_plugin", *, engines=(FakeEngine,), trainers=(FakeTrainer,),
                models=(FAKE_ENTRY,), fixtures=(FAKE_FIXTURE,)) -> types.ModuleType:
    """A plugin module, built in the test, implementing all four hooks."""
    module = types.ModuleType(name)

    @mizuoto.hookimpl
    def register_engines(register):
        for engine in engines:
            register(engine)

    @mizuoto.hookimpl
    def register_trainers(register):
        for trainer in trainers:
            register(trainer)

    @mizuoto.hookimpl
    def register_models(register):
        for entry in models:
            register(entry)

    @mizuoto.hookimpl
    def register_contract_fixtures(register):
        for fixture in fixtures:
            register(fixture)

    module.register_engines = register_engines
    module.register_trainers = register_trainers
    module.register_models = register_models
    module.register_contract_fixtures = register_contract_fixtures
    return module


@pytest.fixture
def no_plugins(monkeypatch):
    """No entry point loads (``MIZUOTO_PLUGINS=""``); the real plugins come back afterwards."""
    monkeypatch.setenv("MIZUOTO_PLUGINS", "")
    plugins.reset_plugins()
    plugins.load_plugins()
    yield plugins.pm
    plugins.reset_plugins()


@pytest.fixture
def fake_plugin(no_plugins):
    """Only the in-test plugin: engine ``fake``, its trainer, catalog entry and fixture."""
    no_plugins.register(make_plugin(), name="fake_plugin")
    registry.clear_cache()
    return no_plugins


@pytest.fixture
def threads(request):
    """torch's thread count for one test (``indirect`` parametrization), restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)
