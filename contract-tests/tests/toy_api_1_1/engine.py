"""FROZEN (see the package's docstring): the chime engine, imported when a model is loaded."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch

from mizuoto.plugin import (
    Audio,
    Engine,
    ModelFilesMissing,
    Options,
    Reference,
    Rendered,
    SynthesisRequest,
    Voice,
    check_output_length,
    check_state_dict,
    load_state_dict_file,
    place,
    read_reference,
    read_utf8,
    report,
    save_safetensors,
    weights_fingerprint,
)
from toy_api_1_1 import CAPABILITIES, ChimeParams

CONFIG = "chime.json"
WEIGHTS = "chime.safetensors"


class ChimeEngine(Engine):
    name = "chime"
    params_class = ChimeParams
    request_settings = frozenset()  # no sampler: steps and guidance are refused by name
    devices = frozenset({"cpu"})
    dtypes = frozenset({"float32"})

    def __init__(self, pitch: torch.Tensor, info, placement) -> None:
        self._pitch = pitch
        self._info = info
        self.placement = placement

    @classmethod
    def recognizes(cls, model_dir: Path) -> bool:
        return (Path(model_dir) / CONFIG).is_file()

    @classmethod
    def load(cls, model_dir: Path, *, options: Options | None = None,
             model_id: str | None = None, progress=None) -> ChimeEngine:
        model_dir = Path(model_dir)
        placement = place(cls, (options or Options()).compute,
                          device=lambda: torch.device("cpu"))
        missing = [n for n in (CONFIG, WEIGHTS) if not (model_dir / n).is_file()]
        if missing:
            raise ModelFilesMissing(str(model_dir), missing)
        config = json.loads(read_utf8(model_dir / CONFIG, "chime.json"))
        weights = load_state_dict_file(model_dir / WEIGHTS)
        check_state_dict({"pitch": (int(config["entries"]),)}, weights, model_dir / WEIGHTS)
        info = placement.model_info(
            model=model_id or str(model_dir), variant="tiny",
            sample_rate=int(config["sample_rate"]), capabilities=CAPABILITIES, license="MIT",
            fingerprint=weights_fingerprint([model_dir / WEIGHTS], context=config))
        report(progress, "load", 1, 1)
        return cls(weights["pitch"].to(torch.float64), info, placement)

    @property
    def info(self):
        return self._info

    def _stream(self, request: SynthesisRequest, params: ChimeParams, generator,
                progress) -> Iterator[Rendered]:
        # checked now, not at the first chunk: a bad reference or a long text fails at stream()
        rate = self._info.sample_rate
        per_char = max(1, round(params.char_seconds * rate))
        check_output_length(len(request.text) * per_char / rate, params.max_seconds,
                            setting="params.max_seconds")
        if request.voice is not None:
            shift, level = request.voice.tensors["shape"].tolist()
        elif request.reference is not None:
            shift, level = _shape(read_reference(request.reference, rate))
        else:
            shift, level = 1.0, 1.0
        return self._ring(request.text, params, shift, level, per_char, generator, progress)

    def _build_voice(self, reference: Reference) -> Voice:
        shape = _shape(read_reference(reference, self._info.sample_rate))
        return self.make_voice({"shape": torch.tensor(shape, dtype=torch.float64)})

    def _ring(self, text, params, shift, level, per_char, generator, progress):
        rate = self._info.sample_rate
        time = torch.arange(per_char, dtype=torch.float64) / rate
        decay = torch.exp(-time * 30.0)
        words = text.split(" ")
        for index, word in enumerate(words):
            chars = word + (" " if index < len(words) - 1 else "")
            tones = []
            for char in chars:
                jitter = torch.randn(per_char, generator=generator, dtype=torch.float64)
                if char.isspace():
                    tones.append(0.01 * jitter)
                    continue
                pitch = self._pitch[ord(char) % self._pitch.shape[0]] * shift
                tone = torch.sin(2 * math.pi * pitch * time)
                overtone = torch.sin(2 * math.pi * 2 * pitch * time)
                tones.append(0.2 * level * decay * ((1 - params.brightness) * tone
                                            + params.brightness * overtone) + 0.01 * jitter)
            report(progress, "chunk", index + 1, len(words))
            samples = torch.cat(tones) if tones else torch.zeros(0, dtype=torch.float64)
            yield Rendered(Audio(samples.to(torch.float32), rate), chunks=len(words),
                           sampler={"char_seconds": params.char_seconds},
                           last=index == len(words) - 1)


def _shape(audio: Audio) -> tuple[float, float]:
    """A pitch factor from the reference's zero-crossing rate (relative to 1 kHz) and a level
    factor from its RMS (relative to 0.1)."""
    samples = audio.samples.to(torch.float64)
    signs = torch.signbit(samples)
    crossings = int((signs[1:] != signs[:-1]).sum())
    shift = min(max(crossings / 2 / audio.duration / 1000.0, 0.25), 4.0)
    level = min(max(float(samples.pow(2).mean().sqrt()) / 0.1, 0.2), 4.0)
    return shift, level


def write_tiny_model(directory: Path, *, entries: int = 32, sample_rate: int = 8000) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)
    pitch = 150.0 + 350.0 * torch.rand(entries, generator=generator)
    save_safetensors({"pitch": pitch}, directory / WEIGHTS)
    (directory / CONFIG).write_text(json.dumps({"entries": entries, "sample_rate": sample_rate}))
