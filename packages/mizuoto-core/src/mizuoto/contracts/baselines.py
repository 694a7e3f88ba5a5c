"""Upstream baselines: the package an engine reproduces, driven by ``mizuoto bench
--against-upstream`` in a process of its own.

An engine plugin registers one per upstream package (``register_upstream_baselines``). The
driver module imports the upstream package, so it is imported only in the benchmark's upstream
child process: never by Mizuoto's runtime, never by the plugin module.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import attrs

from mizuoto.errors import MizuotoError

if TYPE_CHECKING:
    import numpy as np

    from mizuoto.contracts.requests import SynthesisRequest


class UpstreamDriver(Protocol):
    """What a baseline's ``driver`` class is: loaded once per child, then asked for one or more
    requests. Audio comes back as mono float32 samples, as Mizuoto's engine returns them, so
    that the benchmark can tell whether the two are bit-identical."""

    sample_rate: int

    @classmethod
    def load(cls, model_dir: Path) -> UpstreamDriver: ...

    def synthesize(self, request: SynthesisRequest) -> np.ndarray: ...

    def stream(self, request: SynthesisRequest) -> Iterator[np.ndarray]: ...


@attrs.frozen
class UpstreamBaseline:
    """``engine``: the Mizuoto engine that reproduces ``distribution`` (the upstream PyPI
    name, e.g. ``f5-tts``; the benchmark reports its installed version). ``driver``:
    ``"module:Class"`` of an :class:`UpstreamDriver`, imported only in the upstream child."""

    engine: str
    distribution: str
    driver: str = attrs.field()
    description: str = ""

    @driver.validator
    def _check_driver(self, attribute, value: str) -> None:
        module, _, name = value.partition(":")
        if not module or not name:
            raise MizuotoError(f"UpstreamBaseline {self.engine!r}: driver must be "
                               f"'module:Class', got {value!r}")

    def load_driver(self) -> type[UpstreamDriver]:
        """Import the driver class (and with it the upstream package)."""
        module_name, _, name = self.driver.partition(":")
        try:
            return getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError) as exc:
            raise MizuotoError(f"upstream driver {self.driver} for engine {self.engine!r} "
                               f"could not be imported: {exc}") from exc
