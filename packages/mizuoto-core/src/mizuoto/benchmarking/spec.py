"""What one benchmark child process runs, passed to it as JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

SIDES = ("mizuoto", "upstream")


def _frozen(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(value or {}))


@attrs.frozen
class RunSpec:
    """One child's work: load ``model`` on ``side`` with the configuration's options, then
    send the same request ``requests`` times (``stream``: through the engine's stream).

    ``model`` is what ``mizuoto.load`` takes (a catalog id or a directory); ``model_dir`` is
    the resolved directory the upstream driver loads. ``threads`` (when set) is applied on both
    sides; Mizuoto's side also gets it as ``compute.cpu_threads`` in ``option_pairs``.
    """

    side: str = attrs.field(validator=attrs.validators.in_(SIDES))
    model: str
    model_dir: str
    engine: str
    text: str
    seed: int
    option_pairs: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    options_file: str | None = None
    ref_audio: str | None = None
    ref_text: str | None = None
    steps: int | None = None
    guidance: float | None = None
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=_frozen)
    stream: bool = False
    requests: int = 1
    threads: int | None = None
    #: one more request, timed component by component (``mizuoto bench --profile``)
    profile: bool = False
    #: where the child saves its first request's samples (``.npy``, float32), for the SNR
    #: columns of ``mizuoto bench`` (:mod:`mizuoto.benchmarking.quality`)
    audio_path: str | None = None

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self, value_serializer=_serialize))

    @classmethod
    def from_json(cls, text: str) -> RunSpec:
        return cls(**json.loads(text))

    def request(self):
        """The :class:`~mizuoto.contracts.requests.SynthesisRequest` both sides receive."""
        from mizuoto.contracts.requests import Reference, SynthesisRequest

        reference = Reference(self.ref_audio, self.ref_text) if self.ref_audio else None
        return SynthesisRequest(self.text, reference=reference, seed=self.seed,
                                steps=self.steps, guidance=self.guidance,
                                params=dict(self.params))


def _serialize(instance, attribute, value):
    if isinstance(value, MappingProxyType):
        return dict(value)
    if isinstance(value, tuple):
        return list(value)
    return value
