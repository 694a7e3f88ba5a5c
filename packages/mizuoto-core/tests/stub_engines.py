"""A stub engine for core's unit tests: nothing to load, one :class:`ModelInfo`; a test's
engine subclasses it and writes only the calls it tests."""

from __future__ import annotations

from typing import ClassVar

from mizuoto import Capability, Engine, ModelInfo


class StubEngine(Engine):
    """``load`` returns ``cls()``; :attr:`info` names the engine by ``name``, the model by
    ``model_name``, and declares ``declared`` (the capabilities), ``sample_rate`` and
    ``fingerprint``. A subclass that overrides a public call (``synthesize``) is a plugin
    written for API 1.0, as it would be without this base."""

    model_name: ClassVar[str] = "m"
    declared: ClassVar[frozenset[Capability]] = frozenset({Capability.ZERO_SHOT,
                                                           Capability.STREAM})
    sample_rate: ClassVar[int] = 8000
    fingerprint: ClassVar[str] = ""

    def __init__(self) -> None:
        self._info = ModelInfo(self.name, self.model_name, "v0", self.sample_rate, "float32",
                               "cpu", self.declared, fingerprint=self.fingerprint)

    @classmethod
    def load(cls, model_dir, *, options=None, model_id=None, progress=None):
        return cls()

    @property
    def info(self) -> ModelInfo:
        return self._info
