"""The engine contract: load a model directory, declare capabilities, synthesize."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from mizuoto.contracts.capabilities import Capability
from mizuoto.contracts.progress import ProgressCallback
from mizuoto.contracts.requests import EditRequest, Reference, SynthesisRequest
from mizuoto.contracts.results import AudioChunk, SynthesisResult
from mizuoto.contracts.voice import Voice
from mizuoto.errors import InvalidRequest, UnsupportedCapability

if TYPE_CHECKING:
    from mizuoto.options import Options


@attrs.frozen
class ModelInfo:
    """What a loaded model is, and how it runs."""

    engine: str
    model: str  # catalog id or directory
    variant: str  # e.g. "v1_base", "voxcpm2"
    sample_rate: int
    dtype: str
    device: str
    capabilities: frozenset[Capability]
    license: str | None = None
    non_commercial: bool = False
    fingerprint: str = ""  # identity of the weights, for voice files


class Engine(abc.ABC):
    """A text-to-speech engine bound to one loaded model.

    Subclasses set ``name`` and implement :meth:`load`, :attr:`info` and :meth:`synthesize`,
    plus :meth:`stream`, :meth:`edit` and :meth:`build_voice` for the capabilities they declare.
    ``params_class`` (an attrs class) validates ``request.params``; ``options_class`` validates
    the ``engines.<name>.*`` options.
    """

    name: ClassVar[str]
    params_class: ClassVar[type | None] = None
    options_class: ClassVar[type | None] = None

    @classmethod
    @abc.abstractmethod
    def load(cls, model_dir: Path, *, options: Options | None = None,
             model_id: str | None = None, progress: ProgressCallback | None = None) -> Engine:
        """Load the model in ``model_dir``; raise ModelFilesMissing / CheckpointMismatch."""

    @classmethod
    def recognizes(cls, model_dir: Path) -> bool:
        """True when ``model_dir`` looks like one of this engine's models (for auto-detection)."""
        return False

    @property
    @abc.abstractmethod
    def info(self) -> ModelInfo: ...

    @property
    def capabilities(self) -> frozenset[Capability]:
        return self.info.capabilities

    def supports(self, capability: Capability) -> bool:
        return capability in self.capabilities

    def require(self, capability: Capability) -> None:
        if capability not in self.capabilities:
            raise UnsupportedCapability(
                f"{self.name} model {self.info.model} does not support {capability.value}"
            )

    @abc.abstractmethod
    def synthesize(self, request: SynthesisRequest, *,
                   progress: ProgressCallback | None = None) -> SynthesisResult: ...

    def stream(self, request: SynthesisRequest, *,
               progress: ProgressCallback | None = None) -> Iterator[AudioChunk]:
        self.require(Capability.STREAM)
        raise NotImplementedError

    def edit(self, request: EditRequest, *,
             progress: ProgressCallback | None = None) -> SynthesisResult:
        self.require(Capability.EDIT)
        raise NotImplementedError

    def build_voice(self, reference: Reference) -> Voice:
        self.require(Capability.VOICE_CACHE)
        raise NotImplementedError

    def parse_params(self, params) -> Any:
        """Validate ``request.params`` into ``params_class``; unknown keys are named."""
        return parse_attrs(self.params_class, params, "params")


def parse_attrs(cls: type | None, values, prefix: str) -> Any:
    """Build the attrs class ``cls`` from a mapping, naming unknown keys and bad values."""
    values = dict(values or {})
    if cls is None:
        if values:
            raise InvalidRequest(f"{prefix}.{next(iter(values))}", "is not a known setting")
        return None
    known = {a.name for a in attrs.fields(cls)}
    for key in values:
        if key not in known:
            raise InvalidRequest(f"{prefix}.{key}", "is not a known setting",
                                 f"known: {', '.join(sorted(known))}")
    try:
        return cls(**values)
    except InvalidRequest:
        raise
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(prefix, str(exc)) from exc
