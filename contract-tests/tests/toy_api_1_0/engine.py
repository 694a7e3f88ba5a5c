"""The toy engine: hums the text, one tone per character (imported when a model is loaded).

This module is the only one that imports torch; the plugin module (``toy_api_1_0``)
registers the engine by its location, ``toy_api_1_0.engine:ToyEngine``.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from pathlib import Path

import attrs
import numpy as np
import torch
from safetensors.torch import save_file

from mizuoto import (
    Applied,
    Audio,
    AudioChunk,
    Capability,
    Engine,
    ModelInfo,
    Options,
    Reference,
    SynthesisRequest,
    SynthesisResult,
    Voice,
)
from mizuoto.contracts.progress import report
from mizuoto.errors import InvalidOption, ModelFilesMissing
from mizuoto.nn.dsp.audio_io import check_not_silent, read_audio, to_mono
from mizuoto.runtime.checkpoint import check_state_dict, load_state_dict_file
from mizuoto.runtime.seeds import resolve_seed
from mizuoto.runtime.threads import apply_cpu_threads
from toy_api_1_0 import CAPABILITIES, CONFIG_FILE, WEIGHTS_FILE, ToyOptions, ToyParams

_WEIGHT_NAMES = ("pitch", "level")  # each of shape (vocab_size,)


@attrs.frozen
class _VoiceShape:
    """What the toy takes from a reference: a pitch factor and a loudness factor."""

    pitch_scale: float
    level_scale: float

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"pitch_scale": torch.tensor([self.pitch_scale], dtype=torch.float64),
                "level_scale": torch.tensor([self.level_scale], dtype=torch.float64)}


_NEUTRAL = _VoiceShape(1.0, 1.0)


class ToyEngine(Engine):
    """Hums the text. Zero-shot, cloning, streaming and saved voices; no editing or design."""

    name = "toy"
    params_class = ToyParams
    options_class = ToyOptions

    def __init__(self, *, pitch: torch.Tensor, level: torch.Tensor, info: ModelInfo,
                 options: ToyOptions) -> None:
        self._pitch = pitch
        self._level = level
        self._info = info
        self._options = options

    @classmethod
    def recognizes(cls, model_dir: Path) -> bool:
        try:
            return "toy_vocab_size" in json.loads((Path(model_dir) / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            return False

    @classmethod
    def load(cls, model_dir: Path, *, options: Options | None = None,
             model_id: str | None = None, progress=None) -> ToyEngine:
        model_dir = Path(model_dir)
        options = options or Options()
        engine_options = options.engine_options(cls)
        if options.compute.device not in ("auto", "cpu"):
            raise InvalidOption("compute.device", "the toy engine runs on the CPU only")
        if options.compute.dtype not in ("auto", "float32"):
            raise InvalidOption("compute.dtype", "the toy engine runs in float32 only")
        apply_cpu_threads(options.compute)
        missing = [n for n in (CONFIG_FILE, WEIGHTS_FILE) if not (model_dir / n).is_file()]
        if missing:
            raise ModelFilesMissing(str(model_dir), missing)
        config = json.loads((model_dir / CONFIG_FILE).read_text())
        weights_path = model_dir / WEIGHTS_FILE
        weights = load_state_dict_file(weights_path)
        vocab_size = int(config["toy_vocab_size"])
        # every missing, unexpected and mis-shaped tensor reported at once (CheckpointMismatch)
        check_state_dict({name: (vocab_size,) for name in _WEIGHT_NAMES}, weights, weights_path)
        info = ModelInfo(
            engine=cls.name,
            model=model_id or str(model_dir),
            variant=str(config.get("variant", "toy")),
            sample_rate=int(config["sample_rate"]),
            dtype="float32",
            device="cpu",
            capabilities=CAPABILITIES,
            license="Apache-2.0",
            # A voice file is only valid for the weights it was built with.
            fingerprint=hashlib.sha256(weights_path.read_bytes()).hexdigest(),
        )
        report(progress, "load", 1, 1)
        return cls(pitch=weights["pitch"].to(torch.float64),
                   level=weights["level"].to(torch.float64), info=info, options=engine_options)

    @property
    def info(self) -> ModelInfo:
        return self._info

    def synthesize(self, request: SynthesisRequest, *, progress=None) -> SynthesisResult:
        chunks = list(self._render(*self._prepare(request), progress))
        samples = torch.cat([chunk.audio.samples for chunk in chunks])
        return SynthesisResult(Audio(samples, self._info.sample_rate), chunks[-1].applied)

    def stream(self, request: SynthesisRequest, *, progress=None) -> Iterator[AudioChunk]:
        self.require(Capability.STREAM)
        # Check the request now: a generator would raise only once iterated.
        return self._render(*self._prepare(request), progress)

    def _prepare(self, request: SynthesisRequest):
        """Validate the request and reduce it to what rendering needs."""
        params = self.parse_params(request.params)
        if request.instruction is not None:
            self.require(Capability.DESIGN)
        if request.voice is not None:
            request.voice.check(self.name, self._info.fingerprint)
            shape = _VoiceShape(float(request.voice.tensors["pitch_scale"][0]),
                                float(request.voice.tensors["level_scale"][0]))
        elif request.reference is not None:
            self.require(Capability.CLONE)
            shape = _analyse(_read_reference(request.reference))
        else:
            self.require(Capability.ZERO_SHOT)
            shape = _NEUTRAL
        seed, drawn = resolve_seed(request.seed)
        return request.text, params, shape, seed, drawn

    def build_voice(self, reference: Reference) -> Voice:
        self.require(Capability.VOICE_CACHE)
        shape = _analyse(_read_reference(reference))
        return Voice(engine=self.name, model_fingerprint=self._info.fingerprint,
                     sample_rate=self._info.sample_rate, tensors=shape.tensors(),
                     texts={"reference": reference.text or ""})

    def _render(self, text: str, params: ToyParams, shape: _VoiceShape, seed: int, drawn: bool,
                progress) -> Iterator[AudioChunk]:
        rate = self._info.sample_rate
        per_char = max(1, round(params.char_seconds * rate))
        max_chars = max(1, int(params.max_seconds * rate) // per_char)
        words = _words(text[:max_chars])
        generator = torch.Generator().manual_seed(seed)
        time = torch.arange(per_char, dtype=torch.float64) / rate
        envelope = torch.hann_window(per_char, periodic=False, dtype=torch.float64)
        breath = self._options.breathiness
        applied = Applied(engine=self.name, model=self._info.model, seed=seed, seed_drawn=drawn,
                          dtype=self._info.dtype, device=self._info.device,
                          sampler={"char_seconds": params.char_seconds},
                          license=self._info.license, chunks=len(words))
        for index, word in enumerate(words):
            pieces = []
            for char in word:
                slot = ord(char) % self._pitch.shape[0]
                noise = torch.randn(per_char, generator=generator, dtype=torch.float64)
                if char.isspace():
                    pieces.append(torch.zeros(per_char, dtype=torch.float64))
                    continue
                tone = torch.sin(2 * math.pi * self._pitch[slot] * shape.pitch_scale * time)
                level = self._level[slot] * shape.level_scale
                pieces.append(level * envelope * ((1 - breath) * tone + breath * noise))
            last = index == len(words) - 1
            report(progress, "chunk", index + 1, len(words))
            yield AudioChunk(Audio(torch.cat(pieces).to(torch.float32), rate), index,
                             is_last=last, applied=applied if last else None)


def _words(text: str) -> list[str]:
    """Split after each space so that the pieces join back into ``text``."""
    words, current = [], ""
    for char in text:
        current += char
        if char.isspace():
            words.append(current)
            current = ""
    if current:
        words.append(current)
    return words


def _read_reference(reference: Reference) -> Audio:
    """The reference as mono audio; InvalidAudio for a missing, unreadable or silent one."""
    if isinstance(reference.audio, Audio):
        audio = reference.audio
    else:
        channels, rate = read_audio(reference.audio, field="reference.audio")
        audio = Audio(to_mono(channels)[0], rate)
    check_not_silent(audio.samples, "reference.audio")
    return audio


def _analyse(audio: Audio) -> _VoiceShape:
    """Pitch from the zero-crossing rate and loudness from the RMS, relative to 150 Hz / 0.1."""
    samples = audio.samples.to(torch.float64)
    signs = torch.signbit(samples)
    crossings = int((signs[1:] != signs[:-1]).sum())
    pitch = crossings / 2 / audio.duration
    rms = float(samples.pow(2).mean().sqrt())
    return _VoiceShape(pitch_scale=min(max(pitch / 150.0, 0.25), 4.0),
                       level_scale=min(max(rms / 0.1, 0.1), 10.0))


def write_tiny_model(directory: Path, *, vocab_size: int = 64, sample_rate: int = 16000,
                     seed: int = 0) -> None:
    """Write a random toy model: pitches in 100–300 Hz, levels in 0.05–0.3."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(seed)
    weights = {
        "pitch": torch.from_numpy(generator.uniform(100.0, 300.0, vocab_size).astype(np.float32)),
        "level": torch.from_numpy(generator.uniform(0.05, 0.3, vocab_size).astype(np.float32)),
    }
    save_file(weights, str(directory / WEIGHTS_FILE))
    config = {"toy_vocab_size": vocab_size, "sample_rate": sample_rate, "variant": "tiny"}
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
