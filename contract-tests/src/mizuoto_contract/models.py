"""The models under test: each contract fixture written once and loaded once per session."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import attrs

from mizuoto import ComputeOptions, ContractFixture, Engine, Options
from mizuoto.registry import contract_fixtures, engines, get_engine
from mizuoto_contract.reference import write_reference

log = logging.getLogger(__name__)

# One CPU thread: the suite checks behaviour, and results must not depend on the machine.
CONTRACT_OPTIONS = Options(compute=ComputeOptions(device="cpu", cpu_threads=1))


@attrs.frozen
class ContractModel:
    """A fixture's model directory, loaded with its engine."""

    fixture: ContractFixture
    directory: Path
    engine: Engine
    reference_path: Path  # the suite's voiced reference, at the model's sample rate


@attrs.define
class ContractModels:
    """Select fixtures by engine name, then write and load each on first use."""

    make_root: Callable[[], Path]
    engine_names: tuple[str, ...] = ()
    _root: Path | None = None
    _loaded: dict[str, ContractModel | BaseException] = attrs.field(factory=dict)

    def fixtures(self) -> list[ContractFixture]:
        """The selected fixtures; an error naming what is installed when there are none."""
        available = contract_fixtures()
        if not self.engine_names:
            if not available:
                raise LookupError(_nothing_installed())
            return [available[key] for key in sorted(available)]
        chosen = []
        for name in self.engine_names:
            found = [f for key, f in sorted(available.items()) if f.engine == name]
            if not found:
                installed = sorted({f.engine for f in available.values()}) or ["none"]
                hint = "" if name in engines() else f"; engine {name!r} is not installed"
                raise LookupError(f"--mizuoto-engine {name}: no contract fixture registers that "
                                  f"engine{hint} (engines with fixtures: {', '.join(installed)})")
            chosen.extend(f for f in found if f not in chosen)
        return chosen

    def get(self, fixture: ContractFixture) -> ContractModel:
        """The loaded model; raises again, in every test that uses it, if loading failed."""
        if fixture.id not in self._loaded:
            try:
                self._loaded[fixture.id] = self._load(fixture)
            except Exception as exc:  # the tests report it; collection must go on
                log.debug("contract fixture %s failed to load", fixture.id, exc_info=True)
                self._loaded[fixture.id] = exc
        loaded = self._loaded[fixture.id]
        if isinstance(loaded, BaseException):
            raise RuntimeError(f"contract fixture {fixture.id}: writing or loading its model "
                               f"failed: {type(loaded).__name__}: {loaded}") from loaded
        return loaded

    def _load(self, fixture: ContractFixture) -> ContractModel:
        base = self._base() / fixture.id.replace("/", "--")
        directory = base / "model"
        directory.mkdir(parents=True)
        fixture.make(directory)
        engine = get_engine(fixture.engine).load(directory, options=CONTRACT_OPTIONS,
                                                 model_id=f"contract/{fixture.id}")
        reference = write_reference(base / "reference.wav", engine.info.sample_rate)
        return ContractModel(fixture, directory, engine, reference)

    def _base(self) -> Path:
        if self._root is None:
            self._root = self.make_root()
        return self._root


def _nothing_installed() -> str:
    return ("no installed plugin registers a contract fixture: install an engine "
            "(pip install ./packages/mizuoto-f5tts from a clone of Mizuoto's repository) or "
            "register one with the register_contract_fixtures "
            "hook (docs/plugins.md)")

