"""Results: the audio and a record of what was actually applied to make it."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from mizuoto.contracts.audio import Audio
from mizuoto.errors import NonFiniteAudio

if TYPE_CHECKING:
    import torch


def check_finite(values: torch.Tensor, stage: str) -> None:
    """Raise :class:`~mizuoto.errors.NonFiniteAudio` naming ``stage`` if ``values`` hold a NaN
    or an infinity. Engines call it between their stages (sampler, vocoder); every result and
    stream chunk passes it on construction."""
    import torch

    if values.is_floating_point() and not bool(torch.isfinite(values).all()):
        nan = int(torch.isnan(values).sum())
        raise NonFiniteAudio(stage, nan, int(torch.isinf(values).sum()), values.numel())


def _frozen_dict(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@attrs.frozen
class Applied:
    """What was applied: enough to reproduce the result and to know how it was made."""

    engine: str
    model: str
    seed: int
    seed_drawn: bool  # True when the caller gave no seed and this one was drawn
    dtype: str
    device: str
    sampler: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)
    retries: int = 0
    fallbacks: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    warnings: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    license: str | None = None
    non_commercial: bool = False
    chunks: int = 1
    #: the speed options in effect that the engine implements (``compile``, ``attention``,
    #: ``cuda_graphs``, ``cpu_threads``, ``cpu_allocator``, ...): a result made with an option
    #: that is not bit-identical to upstream (``compile``, ``attention=fast``) says so here
    compute: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)
    #: the request params taken from the model directory's ``mizuoto-defaults.json`` (those
    #: the request did not set; :mod:`mizuoto.contracts.model_defaults`)
    model_defaults: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)


@attrs.frozen
class Rendered:
    """What an engine's own method (``Engine._synthesize``, ``_edit``, each piece of
    ``_stream``) made: the audio and the facts only the engine knows. The base class adds the
    rest of :class:`Applied` (engine, model, seed, dtype, device, license, compute in effect,
    load warnings and the request's notices).

    A stream yields one per chunk; ``last=True`` marks the final one, whose facts describe the
    whole stream (the others' are ignored).
    """

    audio: Audio
    sampler: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)
    retries: int = 0
    fallbacks: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    warnings: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    chunks: int = 1
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen_dict)
    last: bool = True


@attrs.frozen
class SynthesisResult:
    """An engine's audio and how it was made. Audio with NaN or infinite samples is refused
    (:class:`~mizuoto.errors.NonFiniteAudio`): no engine can return it."""

    audio: Audio
    applied: Applied

    def __attrs_post_init__(self):
        check_finite(self.audio.samples, f"{self.applied.engine} output")

    def save(self, path) -> None:
        """Write the audio atomically, with the applied record (and license mark) as metadata."""
        self.audio.save(path, metadata=file_metadata(self.applied))


def file_metadata(applied: Applied) -> dict[str, str]:
    """What a written result carries as metadata: engine and seed, and the license mark."""
    metadata = {"comment": f"mizuoto {applied.engine} seed={applied.seed}"}
    if applied.license:
        metadata["copyright"] = applied.license
    if applied.non_commercial:
        metadata["comment"] += f"; non-commercial weights ({applied.license})"
    return metadata


@attrs.frozen
class AudioChunk:
    """One piece of a stream, yielded as soon as its audio is ready.

    The last chunk (``is_last``) carries the ``applied`` record, no other does. An engine that
    learns only after its last audio that the stream has ended yields a final chunk with no
    samples rather than hold audio back; no other chunk is empty.
    """

    audio: Audio
    index: int
    is_last: bool = False
    applied: Applied | None = None

    def __attrs_post_init__(self):
        check_finite(self.audio.samples, f"stream chunk {self.index}")
