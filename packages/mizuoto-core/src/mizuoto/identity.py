"""What a synthesized file depends on, as a JSON-able record and a digest.

Resumable outputs (long-form runs, batch lines) keep this record beside what they wrote; a rerun
reuses the work only when the record is the same: the model's identity, the request's settings,
and the content (not the path) of a reference recording or a saved voice.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from mizuoto.contracts.audio import Audio
from mizuoto.contracts.engine import Engine
from mizuoto.contracts.requests import SynthesisRequest

_BLOCK = 1 << 20


def file_digest(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _audio_digest(audio) -> str:
    if isinstance(audio, Audio):
        digest = hashlib.sha256(f"{audio.sample_rate}:".encode())
        digest.update(audio.numpy().tobytes())
        return digest.hexdigest()
    path = Path(audio)
    return file_digest(path) if path.is_file() else f"missing:{path}"


def _voice_digest(voice) -> str | None:
    if voice is None:
        return None
    import torch

    digest = hashlib.sha256(json.dumps(
        [voice.engine, voice.model_fingerprint, voice.sample_rate, dict(voice.texts),
         dict(voice.meta)], sort_keys=True, default=repr).encode())
    for name in sorted(voice.tensors):
        tensor = voice.tensors[name].detach().contiguous().cpu()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


#: ``applied.compute`` keys of an inexact fast profile (an engine option such as
#: ``engines.voxcpm.fast``): other samples than the exact path's
FAST_PROFILE_KEYS = ("fast", "fast_dtype", "fast_kernel")


def model_identity(engine: Engine) -> dict[str, Any]:
    """The loaded model as it affects the samples: engine, weights, dtype and device, and the
    fast profile where one is on (int8 or autocast samples must not be taken for the exact
    path's in a resumed run; the exact path's record is unchanged)."""
    info = engine.info
    record = {"engine": info.engine, "model": info.model, "variant": info.variant,
              "fingerprint": info.fingerprint, "dtype": info.dtype, "device": info.device,
              "sample_rate": info.sample_rate}
    placement = getattr(engine, "placement", None)
    if placement is not None and placement.fast_profile:
        settings = placement.in_effect
        record.update({key: settings[key] for key in FAST_PROFILE_KEYS if key in settings})
    return record


def request_identity(request: SynthesisRequest, *, text: bool = True) -> dict[str, Any]:
    """The request's settings; the text's SHA-256 unless ``text=False``; the content of its
    reference audio and voice (a file renamed but unchanged keeps its identity)."""
    reference = request.reference
    record: dict[str, Any] = {
        "reference": None if reference is None else
        {"audio": _audio_digest(reference.audio), "text": reference.text},
        "voice": _voice_digest(request.voice),
        "instruction": request.instruction,
        "seed": request.seed,
        "steps": request.steps,
        "guidance": request.guidance,
        "params": dict(request.params),
    }
    if text:
        record["text"] = hashlib.sha256(request.text.encode()).hexdigest()
    return record


def digest(record: dict[str, Any]) -> str:
    """SHA-256 of a record as canonical JSON."""
    return hashlib.sha256(canonical_json(record).encode()).hexdigest()


def canonical_json(record: Any) -> str:
    return json.dumps(record, sort_keys=True, ensure_ascii=False, default=repr,
                      separators=(",", ":"))
