"""A voice built once from a reference and reused: the engine's prompt state, saved to a file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from mizuoto.errors import InvalidRequest, VoiceMismatch
from mizuoto.json_files import parse_json
from mizuoto.options import ComputeOptions
from mizuoto.runtime.atomic import save_safetensors
from mizuoto.runtime.startup import set_wait_policy

if TYPE_CHECKING:
    import torch

_FORMAT = "mizuoto-voice/1"
MAX_VOICE_RATE = 768000


@attrs.frozen
class Voice:
    """Engine-specific prompt tensors plus the identity of the model they were built for.

    ``model_fingerprint`` is what the engine checks before using the voice: a voice built for
    another model (or generation, or engine) is refused with :class:`VoiceMismatch`.
    """

    engine: str
    model_fingerprint: str
    sample_rate: int
    tensors: Mapping[str, torch.Tensor] = attrs.field(converter=lambda v: MappingProxyType(dict(v)))
    texts: Mapping[str, str] = attrs.field(factory=dict, converter=lambda v: MappingProxyType(dict(v)))
    meta: Mapping[str, Any] = attrs.field(factory=dict, converter=lambda v: MappingProxyType(dict(v)))

    def check(self, engine: str, model_fingerprint: str) -> None:
        if self.engine != engine or self.model_fingerprint != model_fingerprint:
            raise VoiceMismatch(
                f"this voice was built for {self.engine} model {self.model_fingerprint[:12]}, "
                f"not {engine} model {model_fingerprint[:12]}: build it again with this model"
            )

    def save(self, path: str | Path) -> Path:
        """Write the voice as a safetensors file (atomically)."""
        header = {
            "format": _FORMAT,
            "engine": self.engine,
            "model_fingerprint": self.model_fingerprint,
            "sample_rate": str(self.sample_rate),
            "texts": json.dumps(dict(self.texts), ensure_ascii=False),
            "meta": json.dumps(dict(self.meta), ensure_ascii=False),
        }
        path = Path(path)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.tensors.items()}
        return save_safetensors(tensors, path, metadata=header)

    @classmethod
    def load(cls, path: str | Path) -> Voice:
        from safetensors import safe_open

        # reading the tensors imports torch: OpenMP's wait policy first, as mizuoto.load sets it
        set_wait_policy(ComputeOptions(), serving=False)

        path = Path(path)
        if not path.is_file():
            raise InvalidRequest("voice", f"{path} does not exist", "build a voice first")
        try:
            with safe_open(str(path), framework="pt") as f:
                header = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as exc:  # safetensors raises several unrelated types
            raise InvalidRequest("voice", f"{path} is not a voice file ({exc})") from exc
        if header.get("format") != _FORMAT:
            raise InvalidRequest("voice", f"{path} is not a Mizuoto voice file")
        if any(t.is_floating_point() and not bool(t.isfinite().all()) for t in tensors.values()):
            raise InvalidRequest("voice", f"{path} holds NaN or infinite values",
                                 "build the voice again")
        try:
            engine, fingerprint = header["engine"], header["model_fingerprint"]
            sample_rate = int(header["sample_rate"])
            # a voice file may come from anyone: its header is read as such (bounded nesting
            # and integers), so a damaged one is a named error, not a RecursionError
            texts = parse_json(header.get("texts", "{}"), "its texts header")
            meta = parse_json(header.get("meta", "{}"), "its meta header")
        except (KeyError, ValueError) as exc:  # JSONFileError is a ValueError
            raise InvalidRequest("voice", f"{path} has a damaged header ({exc})") from None
        if not 0 < sample_rate <= MAX_VOICE_RATE or not isinstance(texts, dict) \
                or not all(isinstance(v, str) for v in texts.values()) \
                or not isinstance(meta, dict):
            raise InvalidRequest("voice", f"{path} has a damaged header (sample rate, texts "
                                 "or meta)")
        return cls(engine=engine, model_fingerprint=fingerprint, sample_rate=sample_rate,
                   tensors=tensors, texts=texts, meta=meta)
